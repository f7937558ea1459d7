"""The `ledgerflow` groups list the commands of other modules from a table (ops.cli.command_table), so that
`--help` imports none of them: the table must say what the commands themselves would."""

from __future__ import annotations

import click
import pytest

from ops.cli.command_table import COMMANDS, WORKFLOWS_COMMANDS
from ops.cli.commands import cli
from ops.cli.lazy import LazyCommand, LazyGroup
from ops.cli.workflows import PRIORITIES, workflows_group

GROUPS = {"ledgerflow": (cli, COMMANDS), "workflows": (workflows_group, WORKFLOWS_COMMANDS)}


def loaded(group: click.Group, name: str) -> click.Command:
    command = group.get_command(click.Context(group), name)
    assert command is not None, name
    return command


@pytest.mark.parametrize(("group", "table"), GROUPS.values(), ids=GROUPS.keys())
def test_each_summary_is_the_first_paragraph_of_its_commands_help(
    group: click.Group, table: dict[str, LazyCommand]
) -> None:
    for name, entry in table.items():
        command = loaded(group, name)
        assert command.name == name
        first = " ".join((command.help or "").partition("\n\n")[0].split())
        assert entry.summary == first, name


@pytest.mark.parametrize(("group", "table"), GROUPS.values(), ids=GROUPS.keys())
@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_listing_is_the_one_of_the_loaded_commands(
    group: click.Group, table: dict[str, LazyCommand], width: int
) -> None:
    own = {name: c for name, c in group.commands.items() if name not in table}
    lazy = LazyGroup(group.name, commands=own, lazy=table)
    names = lazy.list_commands(click.Context(lazy))
    every = click.Group(group.name, commands={name: loaded(group, name) for name in names})

    def listing(g: click.Group) -> str:
        ctx = click.Context(g, terminal_width=width)
        formatter = ctx.make_formatter()
        g.format_commands(ctx, formatter)
        return formatter.getvalue()

    assert set(table) <= set(names)
    assert listing(lazy) == listing(every)


def test_the_priority_range_is_the_engines() -> None:
    from workflows import PRIORITY_MAX, PRIORITY_MIN

    assert (PRIORITIES.min, PRIORITIES.max) == (PRIORITY_MIN, PRIORITY_MAX)

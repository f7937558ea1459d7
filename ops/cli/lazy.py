"""A click group whose commands are imported only when one is run or its help shown.

`ledgerflow --help` lists every command with its summary; importing every command's module for that
would load the store, the driver, pydantic and the workflow engine. A `LazyGroup` lists the commands of
other modules from a table of (where, summary) instead, and imports a command's module when the command
is used. The summaries are the first paragraph of each command's help, from which click makes the same
short help as from the command itself; tests/unit/test_cli_lazy.py holds the table to the commands.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import click


class LazyCommand(NamedTuple):
    #: `module:attribute` of the click command.
    where: str
    #: The first paragraph of the command's help, as `--help` lists it.
    summary: str


class LazyGroup(click.Group):
    def __init__(self, *args: Any, lazy: Mapping[str, LazyCommand] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, LazyCommand] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, attribute = self.lazy[cmd_name].where.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command), f"{self.lazy[cmd_name].where} is not a click command"
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing, of the commands loaded and of stand-ins for those not yet loaded, which
        carry their summaries: listing imports nothing."""
        listed: dict[str, click.Command] = {
            name: self.commands.get(name) or click.Command(name, help=self.lazy[name].summary)
            for name in self.list_commands(ctx)
        }
        click.Group(self.name, commands=listed).format_commands(ctx, formatter)

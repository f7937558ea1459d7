"""What the CLI's command modules share: the console, settings from the click context, JSON output."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console, ConsoleDimensions

from ops.settings import Settings

#: The width of output that goes to a pipe or a file: wide enough that no table cuts a cell (`workflo…`)
#: or folds a row; a program reading it gets whole values. COLUMNS, when set, still decides.
PIPED_WIDTH = 100_000


class _Console(Console):
    """rich's console, but output that is not a terminal's is not cut to 80 columns."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        # COLUMNS as it is now, not as it was when this console was made at import (rich reads it once).
        columns = self._environ.get("COLUMNS", "")
        if columns.isdigit():
            return ConsoleDimensions(int(columns), size.height)
        if self.is_terminal:
            return size
        return ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


console = _Console()
#: Errors, progress and logs go to stderr, so that stdout carries only data.
err_console = Console(stderr=True)

#: How node and run states are shown in terminal tables.
ICONS = {
    "succeeded": "[green]✓[/]",
    "running": "[yellow]▶[/]",
    "paused": "[yellow]‖[/]",
    "ready": "[cyan]…[/]",
    "pending": "○",
    "failed": "[red]✗[/]",
    "retry_scheduled": "[magenta]↻[/]",
    "cancelled": "[dim]⊘[/]",
    "continued": "[cyan]↪[/]",
    "parked": "[red]⏸[/]",
    "skipped": "-",
}


def settings_of(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2))

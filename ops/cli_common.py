"""What the CLI's command modules share: the console, settings from the click context, JSON output."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console

from ops.settings import Settings

console = Console()
#: Errors, progress and logs go to stderr, so that stdout carries only data.
err_console = Console(stderr=True)

#: How node and run states are shown in terminal tables.
ICONS = {
    "succeeded": "[green]✓[/]",
    "running": "[yellow]▶[/]",
    "ready": "[cyan]…[/]",
    "pending": "○",
    "failed": "[red]✗[/]",
    "retry_scheduled": "[magenta]↻[/]",
    "cancelled": "[dim]⊘[/]",
    "parked": "[red]⏸[/]",
    "skipped": "-",
}


def settings_of(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2))

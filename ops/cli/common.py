"""What the CLI's command modules share: the consoles, settings from the click context, JSON output.

Every command module imports this one, so it stays light: the consoles (rich) are made when a command
first prints, and the settings are read, and logging set up, when a command first asks for them. That is
how `ledgerflow --help` and `ledgerflow COMMAND --help` answer without loading the store, the driver,
pydantic or rich.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from eventstore import EventStore
    from ops.cli.consoles import console as console
    from ops.cli.consoles import err_console as err_console
    from ops.settings import Settings
else:

    def __getattr__(name: str) -> Any:
        if name in ("console", "err_console"):
            from ops.cli import consoles

            return getattr(consoles, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: How node and run states are shown in terminal tables (rich markup).
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
    """This call's settings, read from LEDGERFLOW_* at the first time a command asks for them; that first
    time also configures logging and checks the database URL (a malformed one is two lines, not a
    traceback later). The root command's context keeps them."""
    root = ctx.find_root()
    if root.obj is None:
        root.obj = _start()
    settings = root.obj
    from ops.settings import Settings

    assert isinstance(settings, Settings)
    return settings


def _start() -> Settings:
    from eventstore.spi import check_database_url
    from ops.settings import Settings
    from ops.telemetry import configure_logging

    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    check_database_url(settings.database_url)
    return settings


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, default=str, indent=2))


@contextmanager
def store_of(ctx: click.Context) -> Iterator[EventStore]:
    """The store of this call's settings, open for the `with` block; the store is imported only here."""
    from eventstore import open_store

    with open_store(settings_of(ctx)) as store:
        yield store

"""The commands on ledgerflow's database itself: `ledgerflow migrate`, `doctor`, `db url` and `psql`. Product
packages are imported inside the commands, so that `--help` loads none of them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ops.cli.common import settings_of

if TYPE_CHECKING:
    from ops.settings import Settings


@click.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Apply pending database migrations (also done automatically on start-up)."""
    from eventstore import apply_migrations, resolve_database_url
    from ops.cli.common import console

    applied = apply_migrations(resolve_database_url(settings_of(ctx)))
    if applied:
        for m in applied:
            console.print(f"applied {m.version:04d}_{m.name}")
    else:
        console.print("the database is up to date")


@click.command()
@click.pass_context
def doctor(ctx: click.Context) -> None:
    """Check the database, migrations, leases, the safe horizon and stuck work; say what to do."""
    from rich.table import Table

    from eventstore import DatabaseUnavailableError, open_store
    from ops.cli.common import console
    from ops.doctor import diagnose, unreachable
    from projector import load_projections
    from workflows import workflow_tables

    settings = settings_of(ctx)
    try:
        _check_reachable(settings)
        with open_store(settings, migrate=False) as store:
            projections = [*load_projections(settings.projection_paths), workflow_tables]
            findings = diagnose(store, projections, abandoned_after=settings.abandoned_after)
    except DatabaseUnavailableError as exc:
        findings = [unreachable(str(exc))]
    marks = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}
    table = Table("", "check", "finding", "what to do")
    for f in findings:
        table.add_row(marks[f.level], f.check, f.detail, f.advice)
    console.print(table)
    if any(f.level == "fail" for f in findings):
        ctx.exit(1)


def _check_reachable(settings: Settings) -> None:
    """One quick connection attempt with the driver's own reason, before the pool, which would retry for
    the whole connect timeout and then only say that it timed out."""
    from eventstore import DatabaseUnavailableError, resolve_database_url
    from eventstore.spi import try_connect
    from ops.cli.errors import explain_connect_failure

    url = resolve_database_url(settings)
    try:
        try_connect(url, timeout=max(1, int(settings.connect_timeout / 3)))
    except DatabaseUnavailableError as exc:
        what, todo = explain_connect_failure(exc, url)
        raise DatabaseUnavailableError(f"{what}; {todo}") from exc


@click.group("db")
def db_group() -> None:
    """The database ledgerflow uses."""


@db_group.command("url")
@click.pass_context
def db_url(ctx: click.Context) -> None:
    """Print the database URL: LEDGERFLOW_DATABASE_URL, or the embedded server's (started if need be)."""
    from eventstore import resolve_database_url
    from ops.cli.common import err_console

    settings = settings_of(ctx)
    click.echo(resolve_database_url(settings))
    if not settings.database_url:
        err_console.print(
            "the embedded server runs while a ledgerflow process uses it (`ledgerflow serve`, `ledgerflow "
            "projector`…); `ledgerflow psql` opens a shell on it and keeps it running meanwhile",
            highlight=False,
        )


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def psql(ctx: click.Context, psql_args: tuple[str, ...]) -> None:
    """Open psql on ledgerflow's database (the embedded one too); extra arguments go to psql,
    e.g. `ledgerflow psql -c 'select * from ledgerflow.stream_catalogue'`."""
    from eventstore import resolve_database_url

    url = resolve_database_url(settings_of(ctx))
    binary = _psql_binary()
    # A child, not exec: this process keeps an embedded server running until psql ends.
    ctx.exit(subprocess.call([binary, url, *psql_args]))  # noqa: S603 (the user's own arguments to psql)


def _psql_binary() -> str:
    from eventstore import ConfigurationError

    found = shutil.which("psql")
    if found:
        return found
    try:
        import pgserver  # the embedded server's package bundles psql

        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"
    except ImportError:
        bundled = None
    if bundled is not None and bundled.exists():
        return str(bundled)
    raise ConfigurationError("psql is not installed; install the postgresql-client package")

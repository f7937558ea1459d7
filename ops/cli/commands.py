"""The `ledgerflow` command line: the root group, its table of the commands other modules define (imported
when used, see `ops.cli.lazy`) and the commands on the log itself. Product packages are imported inside
the commands, so that `--help` loads none of them."""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from ops.cli import structlog_without_rich
from ops.cli.command_table import COMMANDS
from ops.cli.common import emit_json, settings_of
from ops.cli.lazy import LazyGroup

if TYPE_CHECKING:
    from eventstore import EventStore, ExpectedVersion
    from ops.settings import Settings


@contextmanager
def _store(ctx: click.Context) -> Iterator[EventStore]:
    from eventstore import open_store

    with open_store(settings_of(ctx)) as store:
        yield store


def _expected(text: str) -> ExpectedVersion:
    from eventstore import ANY, NO_STREAM, STREAM_EXISTS

    named = {"any": ANY, "no-stream": NO_STREAM, "exists": STREAM_EXISTS}
    if text in named:
        return named[text]
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter("use any, no-stream, exists or a version number") from None


class LedgerflowGroup(LazyGroup):
    """Turns ledgerflow errors, an unreachable database and invalid settings into a line or two that say
    what to do, and exit status 1, instead of a traceback (`--debug` adds it)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors, --help and exit statuses
        except Exception as exc:
            # Imported once something failed: the error module brings the driver and pydantic.
            from ops.cli.common import err_console
            from ops.cli.errors import REPORTED, explain

            if not isinstance(exc, REPORTED):
                raise
            if ctx.params.get("debug"):
                err_console.print_exception()
            explained = explain(exc, os.environ.get("LEDGERFLOW_DATABASE_URL"))
            if explained is None:
                code = getattr(exc, "code", type(exc).__name__)
                err_console.print(f"[bold red]error[/] ({code}): {exc}", highlight=False, soft_wrap=True)
            else:
                what, todo = explained
                err_console.print(f"[bold red]error[/]: {what}\n  {todo}", highlight=False, soft_wrap=True)
            sys.exit(1)


@click.group(cls=LedgerflowGroup, lazy=COMMANDS)
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """ledgerflow: an event-sourced workflow engine on PostgreSQL.

    Uses LEDGERFLOW_DATABASE_URL, or an embedded PostgreSQL when it is unset.
    """
    # The settings are read (and logging set up) when the command first asks for them: settings_of.
    # `kill -USR1 <pid>` prints every thread's stack to stderr and the process goes on: what an operator
    # (or a drill) needs to see where a process that does not stop, or does not progress, is waiting.
    # The process's own stderr: a host that swapped sys.stderr for a buffer (a test runner) has no fd there.
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


@cli.command()
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


@cli.command()
@click.argument("stream_id")
@click.option("--type", "event_type", required=True, help="The event type, e.g. OrderPlaced.")
@click.option("--data", default="{}", help="The event data, a JSON object.")
@click.option("--metadata", default="{}", help="Metadata, a JSON object.")
@click.option("--expected", default="any", help="any, no-stream, exists, or the stream's current version.")
@click.option("--idempotency-key", default=None, help="Makes retries of this append safe.")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def append(
    ctx: click.Context,
    stream_id: str,
    event_type: str,
    data: str,
    metadata: str,
    expected: str,
    idempotency_key: str | None,
    tenant: str,
) -> None:
    """Append one event to a stream."""
    from eventstore import NewEvent
    from eventstore.spi import json_loads

    try:
        # Numbers keep their exact decimal value (1.00000000000000000001 stays so).
        parsed_data, parsed_metadata = json_loads(data), json_loads(metadata)
    except ValueError as exc:
        raise click.BadParameter(f"--data and --metadata take JSON objects: {exc}") from None
    with _store(ctx) as store:
        result = store.append(
            stream_id,
            [NewEvent(event_type, parsed_data, parsed_metadata)],
            expected_version=_expected(expected),
            idempotency_key=idempotency_key,
            tenant=tenant,
        )
    event = result.events[0]
    note = " (duplicate: the original append's result)" if result.duplicate else ""
    # Plain text, not rich's: the most frequent call in scripts loads no table drawing, and a stream id
    # with brackets is printed as it is, not read as markup.
    click.echo(f"{stream_id} is at version {event.stream_version}, position {event.position}{note}")


@cli.command()
@click.argument("stream_id")
@click.option("--tenant", default="default", show_default=True)
@click.option("--backward", is_flag=True, help="Newest first.")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--upcast", is_flag=True, help="Declared types in their latest shape (LEDGERFLOW_EVENT_TYPES).")
@click.pass_context
def read(
    ctx: click.Context, stream_id: str, tenant: str, backward: bool, limit: int, as_json: bool, upcast: bool
) -> None:
    """Print a stream's events, as stored unless --upcast."""
    from eventstore.spi import json_dumps

    with _store(ctx) as store:
        events = store.read_stream(stream_id, tenant=tenant, backward=backward, limit=limit, upcast=upcast)
    if as_json:
        for e in events:
            click.echo(
                json_dumps(
                    {
                        "version": e.stream_version,
                        "position": e.position,
                        "type": e.type,
                        "data": e.data,
                        "metadata": e.metadata,
                        "event_id": str(e.event_id),
                    }
                )
            )
        return
    from rich.table import Table

    from ops.cli.common import console

    table = Table("version", "position", "type", "data", "recorded")
    for e in events:
        table.add_row(
            str(e.stream_version),
            str(e.position),
            e.type,
            json_dumps(e.data)[:80],
            e.recorded_at.isoformat(timespec="seconds"),
        )
    console.print(table)


class _DeferredInterrupt:
    """SIGINT as KeyboardInterrupt, except inside `deferred()` blocks, at whose end it is raised."""

    def __init__(self) -> None:
        self._deferring = False
        self._pending = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._pending:
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self._pending = True
        if not self._deferring:
            raise KeyboardInterrupt


@cli.command()
@click.option("--after", default="0:0", show_default=True, help="A cursor, <transaction_id>:<position>.")
@click.option(
    "--from-now", is_flag=True, help="Start at the head of the log: only events committed from now on."
)
@click.option("--tenant", default=None, help="Only this tenant's events.")
@click.option(
    "--category", "categories", multiple=True, help="Only streams of this category (prefix before '-')."
)
@click.option("--type", "types", multiple=True, help="Only events of this type.")
@click.option("--upcast", is_flag=True, help="Declared types in their latest shape (LEDGERFLOW_EVENT_TYPES).")
@click.pass_context
def tail(
    ctx: click.Context,
    after: str,
    from_now: bool,
    tenant: str | None,
    categories: tuple[str, ...],
    types: tuple[str, ...],
    upcast: bool,
) -> None:
    """Follow the global log from a cursor, one JSON line per event, until interrupted.

    On Ctrl-C it prints (on stderr) the cursor of the last event it printed: resuming from there skips
    nothing."""
    from eventstore import Cursor
    from eventstore.spi import json_dumps
    from ops.cli.common import err_console

    with _store(ctx) as store:
        # From now: below the oldest transaction still open, so that none committing later is skipped
        # (a few events committed just before may show).
        start = Cursor(store.horizon().xmin, 0) if from_now else Cursor.parse(after)
        subscription = store.subscribe(
            start, tenant=tenant, categories=categories or None, types=types or None, upcast=upcast
        )
        printed = start
        interrupt = _DeferredInterrupt()
        try:
            with interrupt.installed():
                for e in subscription:
                    # A line and its cursor go together: Ctrl-C in between waits for both.
                    with interrupt.deferred():
                        click.echo(
                            json_dumps(
                                {
                                    "cursor": str(e.cursor),
                                    "stream": e.stream_id,
                                    "version": e.stream_version,
                                    "type": e.type,
                                    "data": e.data,
                                }
                            )
                        )
                        printed = e.cursor
        except KeyboardInterrupt:
            # Not the subscription's cursor: it is at the end of the page read, past events not printed.
            err_console.print(f"stopped; resume with --after {printed}", highlight=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for programs.")
@click.pass_context
def horizon(ctx: click.Context, as_json: bool) -> None:
    """Show the log's safe horizon and the writers of the log holding it back.

    Only transactions that append (or appended) to this database's log hold it back; others, here or in
    any database of the server, never do."""
    from ops.cli.common import console

    with _store(ctx) as store:
        h = store.horizon()
    if as_json:
        emit_json(dataclasses.asdict(h))
        return
    console.print(
        f"head position {h.head_position}; {h.waiting_events} committed events wait behind the horizon"
    )
    if not h.holders:
        console.print("no writer of the log holds the horizon back")
        return
    from rich.table import Table

    table = Table("pid", "application", "database", "state", "age (s)", "query")
    for holder in h.holders:
        table.add_row(
            str(holder.pid),
            holder.application,
            holder.database,
            holder.state,
            f"{holder.age_seconds:.1f}",
            holder.query[:60],
        )
    console.print(table)
    console.print(
        "readers of the global log wait for these writers of the log; end one with pg_terminate_backend(pid) "
        "if it is stuck"
    )


@cli.command()
@click.option("--api", "api_role", is_flag=True, help="Run the HTTP API and console.")
@click.option("--projector", "projector_role", is_flag=True, help="Run projector workers.")
@click.option("--worker", "worker_role", is_flag=True, help="Run a workflow worker.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.pass_context
def serve(
    ctx: click.Context, api_role: bool, projector_role: bool, worker_role: bool, host: str, port: int
) -> None:
    """Run the API, console, projector and workflow workers in one process (all of them unless some
    roles are named). Stops gracefully on SIGTERM."""
    from ops.serve import serve as run_serve

    everything = not (api_role or projector_role or worker_role)
    run_serve(
        settings_of(ctx),
        api=everything or api_role,
        projector=everything or projector_role,
        worker=everything or worker_role,
        host=host,
        port=port,
    )


@cli.command()
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


@cli.command("events-demo")
@click.option("--events", "count", default=2000, show_default=True, help="How many sample events to append.")
@click.option("--writers", default=4, show_default=True, help="Concurrent appending threads.")
@click.pass_context
def events_demo(ctx: click.Context, count: int, writers: int) -> None:
    """Append sample events from several threads and follow them live through a subscription."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from eventstore import Cursor, NewEvent
    from ops.cli.common import console

    with _store(ctx) as store:
        # Follow from the current horizon: only this demo's new events, not earlier runs'.
        head = store.horizon().xmin
        subscription = store.subscribe(Cursor(head, 0), categories=["demo"])
        per_writer = count // writers

        def produce(worker: int) -> None:
            for i in range(per_writer):
                store.append(f"demo-{worker}", [NewEvent("SampleRecorded", {"worker": worker, "i": i})])

        threads = [threading.Thread(target=produce, args=(w,), daemon=True) for w in range(writers)]
        began = time.monotonic()
        for t in threads:
            t.start()
        total = per_writer * writers
        seen = 0
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("following the log", total=total)
            for page in subscription.pages():
                seen += len(page.events)
                progress.update(task, completed=seen)
                if seen >= total:
                    break
        subscription.stop()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - began
    console.print(
        f"appended and followed {total} events from {writers} writers in {elapsed:.2f}s "
        f"({total / elapsed:,.0f} events/s); resume after cursor {subscription.cursor}",
        highlight=False,
    )


@cli.group("db")
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


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
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


def main() -> None:
    structlog_without_rich.install()
    cli()

"""The commands that follow the global log: `ledgerflow tail`, `ledgerflow horizon` (what holds readers
back) and `ledgerflow events-demo`. Product packages are imported inside the commands, so that `--help`
loads none of them.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import click

from ops.cli.common import emit_json, store_of


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


@click.command()
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

    with store_of(ctx) as store:
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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for programs.")
@click.pass_context
def horizon(ctx: click.Context, as_json: bool) -> None:
    """Show the log's safe horizon and the writers of the log holding it back.

    Only transactions that append (or appended) to this database's log hold it back; others, here or in
    any database of the server, never do."""
    from ops.cli.common import console

    with store_of(ctx) as store:
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


@click.command("events-demo")
@click.option("--events", "count", default=2000, show_default=True, help="How many sample events to append.")
@click.option("--writers", default=4, show_default=True, help="Concurrent appending threads.")
@click.pass_context
def events_demo(ctx: click.Context, count: int, writers: int) -> None:
    """Append sample events from several threads and follow them live through a subscription."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from eventstore import Cursor, NewEvent
    from ops.cli.common import console

    with store_of(ctx) as store:
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

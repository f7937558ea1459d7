"""`ledgerflow projector` and `ledgerflow projections ...`: running and operating projections."""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ops.cli.common import emit_json, settings_of

if TYPE_CHECKING:
    from rich.progress import Progress

    from eventstore import Cursor, EventStore
    from projector import PendingRun, Projection, Run, WorkerSettings


def _projections(ctx: click.Context) -> list[Projection]:
    from ops.services import all_projections

    return all_projections(settings_of(ctx))


_TENANT = click.option(
    "--tenant",
    default=None,
    help="Only this tenant's rows (projections kept per tenant, such as stream_catalogue).",
)


def _worker_settings(ctx: click.Context) -> WorkerSettings:
    from projector import WorkerSettings

    s = settings_of(ctx)
    return WorkerSettings(
        lease_ttl=s.projector_lease_ttl,
        heartbeat_interval=s.projector_heartbeat_interval,
        batch_size=s.projector_batch_size,
        abandoned_after=s.abandoned_after,
        shutdown_database_timeout=s.shutdown_database_timeout,
    )


@click.command("projector")
@click.pass_context
def projector_command(ctx: click.Context) -> None:
    """Run a projector worker until SIGTERM or Ctrl-C; start as many as you like."""
    from ops.budget import budget, log_connection_budget
    from ops.services import StopSignal, open_until_stopped
    from projector import ProjectorWorker

    projections = _projections(ctx)
    settings = settings_of(ctx)
    timeout = min(settings.idle_in_transaction_timeout, settings.projector_lease_ttl)
    stopping = StopSignal.install()  # also while it waits for the database to start
    store = open_until_stopped(
        settings.model_copy(update={"idle_in_transaction_timeout": timeout}), "ledgerflow-projector", stopping
    )
    if store is None:
        return
    with store:
        worker = ProjectorWorker(store, projections, _worker_settings(ctx))
        log_connection_budget(budget("projector", settings, worker.dedicated_connections()))
        stopping.then(worker.stop)
        worker.run()


@click.group("projections")
def projections_group() -> None:
    """Inspect and operate projections: status, runs, replay, rebuild, verify, failures."""


@projections_group.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Cursor, lag, state, owner and open failures of every projection, and the safe horizon."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from projector import projection_health

    with open_store(settings_of(ctx)) as store:
        health = projection_health(store, _projections(ctx), abandoned_after=settings_of(ctx).abandoned_after)
        horizon = store.horizon()
    if as_json:
        emit_json(
            {
                "projections": [h.as_dict() for h in health],
                "horizon": {
                    "xmin": horizon.xmin,
                    "age_seconds": horizon.age_seconds,
                    "waiting_events": horizon.waiting_events,
                    "holders": [
                        {"pid": h.pid, "application": h.application, "age_seconds": h.age_seconds}
                        for h in horizon.holders
                    ],
                },
            }
        )
        return
    table = Table("projection", "state", "cursor", "lag (events)", "lag (s)", "owner", "failures", "last run")
    for h in health:
        table.add_row(
            h.name,
            h.state,
            str(h.cursor),
            f"{h.lag_events} ({h.lag_events_head} to head)",
            f"{h.lag_seconds:.1f}",
            h.owner or "-",
            str(h.open_failures),
            h.last_run or "-",
        )
        for g in h.segments:  # a partitioned projection's segments, each under its own lease
            table.add_row(
                f"  {h.name}#{g.segment}",
                "",
                str(g.cursor),
                "",
                "",
                g.owner or "-",
                str(g.open_failures),
                "",
            )
    console.print(table)
    if horizon.holders:
        oldest = horizon.holders[0]
        console.print(
            f"safe horizon held back {oldest.age_seconds:.1f}s by pid {oldest.pid} "
            f"({oldest.application or 'no application name'}); see `ledgerflow horizon`"
        )


def _with_progress(store: EventStore, run: PendingRun, description: str) -> tuple[Progress, Any]:
    """A progress display on stderr for `run`: events done of the total counted at its start, the rate and
    the time left."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ops.cli.common import err_console
    from projector import get_run

    with store.connection() as conn:
        recorded = get_run(conn, run.run_id)
    total = recorded.events_total if recorded else None
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("events, {task.fields[rate]:,.0f}/s"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=err_console,
    )
    task = bar.add_task(description, total=total, rate=0.0)
    began = time.monotonic()

    def update(events: int, cursor: Cursor, target: Cursor) -> None:
        elapsed = time.monotonic() - began
        grown = max(total or 0, events)  # appends during the run take it past the count made at its start
        bar.update(task, completed=events, total=grown, rate=events / elapsed if elapsed > 0 else 0.0)

    return bar, update


@projections_group.command("rebuild")
@click.argument("name")
@_TENANT
@click.pass_context
def rebuild_command(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Rebuild NAME from the whole log in the shadow, then swap it in atomically."""
    from eventstore import open_store
    from ops.cli.common import console
    from projector import RebuildResult, find, start_rebuild

    with open_store(settings_of(ctx)) as store:
        projection = find(_projections(ctx), name)
        run = start_rebuild(
            store, projection, tenant=tenant, batch_size=settings_of(ctx).projector_batch_size
        )
        bar, update = _with_progress(store, run, f"rebuilding {name}")
        with bar:
            result = run.execute(update)
        assert isinstance(result, RebuildResult)
    kept = (
        f"tenant {tenant!r}'s rows replaced"
        if tenant
        else f"the previous tables are kept in lf_retired_{name}"
    )
    console.print(
        f"rebuilt {name}: {result.events} events, cursor {result.cursor}, digest {result.digest[:16]} "
        f"(run {result.run_id}); {kept}",
        highlight=False,
    )


@projections_group.command("verify")
@click.argument("name")
@_TENANT
@click.pass_context
def verify_command(ctx: click.Context, name: str, tenant: str | None) -> None:
    """Rebuild NAME in a scratch schema and compare digests with the live tables at the same cursor."""
    from eventstore import open_store
    from ops.cli.common import console
    from projector import VerifyResult, find, start_verify

    with open_store(settings_of(ctx)) as store:
        projection = find(_projections(ctx), name)
        run = start_verify(store, projection, tenant=tenant, batch_size=settings_of(ctx).projector_batch_size)
        bar, update = _with_progress(store, run, f"verifying {name}")
        with bar:
            result = run.execute(update)
        assert isinstance(result, VerifyResult)
    if result.equal:
        console.print(
            f"{name} matches a rebuild at cursor {result.cursor} (digest {result.live_digest[:16]})"
        )
        return
    console.print(f"[red]{name} differs from a rebuild at cursor {result.cursor}[/]")
    for diff in result.differences:
        for row in diff.only_in_live:
            console.print(f"  {diff.table}: only live     {row}", highlight=False)
        for row in diff.only_in_rebuilt:
            console.print(f"  {diff.table}: only rebuilt  {row}", highlight=False)
    console.print(f"fix the handler, then `ledgerflow projections rebuild {name}`")
    ctx.exit(3)


@projections_group.command("replay")
@click.argument("name")
@click.option("--after", help="Re-apply events after this cursor (<transaction_id>:<position>).")
@click.option("--since", type=click.DateTime(), help="Re-apply events recorded since this time.")
@_TENANT
@click.pass_context
def replay_command(
    ctx: click.Context, name: str, after: str | None, since: datetime | None, tenant: str | None
) -> None:
    """Re-apply NAME's events after a cursor or since a time.

    A projection that declares it safe is replayed in place: its cursor moves back and the running
    projector re-applies from there. Any other (and any one tenant's rows) is rebuilt instead, which
    gives the state a replay would."""
    from eventstore import Cursor, open_store
    from ops.cli.common import console
    from projector import find, start_replay

    with open_store(settings_of(ctx)) as store:
        run = start_replay(
            store,
            find(_projections(ctx), name),
            after=Cursor.parse(after) if after else None,
            since=since,
            tenant=tenant,
            batch_size=settings_of(ctx).projector_batch_size,
        )
        if run.kind == "replay":
            run.execute()
            console.print(
                f"replay requested (run {run.run_id}); a running `ledgerflow projector` carries it out; "
                f"follow it with `ledgerflow projections runs {name}`"
            )
            return
        console.print(run.note or "", highlight=False)
        bar, update = _with_progress(store, run, f"rebuilding {name}")
        with bar:
            run.execute(update)
    console.print(f"rebuilt {name} (run {run.run_id})", highlight=False)


@projections_group.command("runs")
@click.argument("name", required=False)
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def runs_command(ctx: click.Context, name: str | None, limit: int, as_json: bool) -> None:
    """Recent catch-up, replay, rebuild and verify runs."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from projector import list_runs

    with open_store(settings_of(ctx)) as store, store.connection() as conn:
        runs = list_runs(conn, name, limit)
    if as_json:
        emit_json([_run_dict(r) for r in runs])
        return
    table = Table("id", "projection", "kind", "status", "events", "rate/s", "started", "owner", "error")
    for r in runs:
        table.add_row(
            str(r.id),
            r.projection,
            r.kind,
            r.status,
            str(r.events_processed),
            f"{r.rate:,.0f}",
            r.started_at.isoformat(timespec="seconds"),
            r.owner,
            (r.error or "")[:50],
        )
    console.print(table)


def _run_dict(r: Run) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, datetime) else v) for k, v in r.__dict__.items()} | {"rate": r.rate}


@click.group("failures")
def failures_group() -> None:
    """Events projections could not apply: list, retry, skip."""


@failures_group.command("list")
@click.option("--projection", default=None)
@click.option("--all", "include_closed", is_flag=True, help="Include resolved and skipped failures.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def failures_list(ctx: click.Context, projection: str | None, include_closed: bool, as_json: bool) -> None:
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from projector import list_failures

    with open_store(settings_of(ctx)) as store, store.connection() as conn:
        found = list_failures(conn, projection, include_closed=include_closed)
    if as_json:
        emit_json(
            [
                {
                    k: (str(v) if not isinstance(v, int | str | type(None)) else v)
                    for k, v in f.__dict__.items()
                }
                for f in found
            ]
        )
        return
    table = Table("id", "projection", "status", "position", "stream", "type", "attempts", "error")
    for f in found:
        table.add_row(
            str(f.id),
            f.projection,
            f.status,
            str(f.event_position),
            f.stream_id,
            f.event_type,
            str(f.attempts),
            f"{f.error_class.rsplit('.', 1)[-1]}: {f.error_message}"[:60],
        )
    console.print(table)
    if found:
        console.print("retry with `ledgerflow failures retry ID`, or skip with `ledgerflow failures skip ID`")


def _act(ctx: click.Context, failure_id: int, action: str) -> None:
    from eventstore import NotFoundError, open_store
    from ops.cli.common import console
    from projector import default_actor, request_failure_retry, request_failure_skip

    with open_store(settings_of(ctx)) as store, store.connection() as conn:
        request = request_failure_retry if action == "retry" else request_failure_skip
        if not request(conn, failure_id, default_actor()):
            raise NotFoundError(f"no open failure {failure_id}; see `ledgerflow failures list`")
    console.print(
        f"{action} of failure {failure_id} requested; the projector carries it out on its next step"
    )


@failures_group.command("retry")
@click.argument("failure_id", type=int)
@click.pass_context
def failures_retry(ctx: click.Context, failure_id: int) -> None:
    """Apply the failed event again (after fixing the handler)."""
    _act(ctx, failure_id, "retry")


@failures_group.command("skip")
@click.argument("failure_id", type=int)
@click.pass_context
def failures_skip(ctx: click.Context, failure_id: int) -> None:
    """Skip the failed event for good; the skip is recorded with who asked for it."""
    _act(ctx, failure_id, "skip")

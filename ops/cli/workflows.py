"""`ledgerflow worker`, `ledgerflow workflows ...`, `ledgerflow recover` and `ledgerflow demo`."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import UTC
from typing import TYPE_CHECKING, Any

import click

from ops.cli.command_table import WORKFLOWS_COMMANDS
from ops.cli.common import ICONS, emit_json, settings_of
from ops.cli.lazy import LazyGroup

if TYPE_CHECKING:
    from rich.table import Table

    from ops.settings import Settings
    from workflows import Engine, NodeState, RunState, WorkerSettings, WorkflowRegistry

#: `workflows.PRIORITY_MIN` and `PRIORITY_MAX` (a PostgreSQL integer), here so that `--help` shows the range
#: without importing the engine; tests/unit/test_cli_lazy.py checks that they agree.
PRIORITIES = click.IntRange(-(2**31), 2**31 - 1)


def registry_of(settings: Settings) -> WorkflowRegistry:
    from workflows import load_workflows

    return load_workflows(settings.workflow_paths)


def worker_settings(settings: Settings) -> WorkerSettings:
    from workflows import WorkerSettings

    return WorkerSettings(
        concurrency=settings.worker_concurrency,
        async_concurrency=settings.worker_async_concurrency,
        async_io_threads=settings.worker_async_io_threads,
        lease_ttl=settings.workflow_lease_ttl,
        heartbeat_interval=settings.workflow_heartbeat_interval,
        recovery=settings.recovery,
        recovery_interval=settings.recovery_interval,
        shutdown_grace=settings.worker_shutdown_grace,
        shutdown_database_timeout=settings.shutdown_database_timeout,
    )


@click.command("worker")
@click.option(
    "--name", default=None, help="This worker's stable name (default: LEDGERFLOW_WORKER_NAME or hostname)."
)
@click.pass_context
def worker_command(ctx: click.Context, name: str | None) -> None:
    """Run a workflow worker until SIGTERM or Ctrl-C; start as many as you like."""
    from ops.budget import budget, log_connection_budget
    from ops.process_exit import exit_past_stuck_threads
    from ops.services import StopSignal, open_until_stopped, tenant_quotas
    from workflows import Engine, WorkflowWorker

    settings = settings_of(ctx)
    registry = registry_of(settings)
    if not registry.names():
        raise click.UsageError("no workflows to run: set LEDGERFLOW_WORKFLOWS=package.module:registry")
    # A frozen worker's open transaction would keep its rows locked past its lease: end it by then.
    timeout = min(settings.idle_in_transaction_timeout, settings.workflow_lease_ttl)
    stopping = StopSignal.install()  # also while it waits for the database to start
    store = open_until_stopped(
        settings.model_copy(update={"idle_in_transaction_timeout": timeout}), "ledgerflow-worker", stopping
    )
    if store is None:
        return
    with store:
        worker = WorkflowWorker(
            Engine(store, registry),
            registry,
            worker_settings(settings),
            name=name or settings.worker_name,
            quotas=tenant_quotas(settings, store),  # a debounced burst over its tenant's quota waits
        )
        own = WorkflowWorker.dedicated_connections(registry, worker.settings)
        log_connection_budget(budget("worker", settings, own))
        stopping.then(worker.stop)
        worker.run()
    exit_past_stuck_threads()  # a node body stuck past the grace period was handed back: do not wait on it


@click.group("workflows", cls=LazyGroup, lazy=WORKFLOWS_COMMANDS)
def workflows_group() -> None:
    """Start, list, show, signal, pause, resume, cancel, retry and refresh workflow runs.

    `ledgerflow workflows schedules` lists the schedules with their cron, catch-up, last and next tick."""


def _run_id(text: str) -> uuid.UUID:
    from eventstore import InvalidInputError

    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidInputError(
            f"{text!r} is not a run id (a UUID); see `ledgerflow workflows list`"
        ) from None


def _json_arg(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"--input takes JSON: {exc}") from None


@workflows_group.command("start")
@click.argument("workflow")
@click.option("--input", "input_json", default=None, help="The run's input, JSON.")
@click.option("--key", default=None, help="At most one active run per key.")
@click.option("--idempotency-key", default=None)
@click.option("--tenant", default="default", show_default=True)
@click.option("--debounce-key", default=None, help="One run per burst of starts with this key.")
@click.option(
    "--debounce-window",
    type=float,
    default=None,
    help="With --debounce-key: the run starts this many seconds after the burst's last start.",
)
@click.option(
    "--debounce-max-wait",
    type=float,
    default=None,
    help="With --debounce-key: ...or this many seconds after its first start, whichever comes first.",
)
@click.option(
    "--priority",
    type=PRIORITIES,
    default=None,
    help="Higher is claimed first among the tenant's ready nodes (default: the workflow's).",
)
@click.option("--tag", "tags", multiple=True, help="KEY=VALUE (repeatable): a tag to find the run by.")
@click.option(
    "--print-id", is_flag=True, help="Print only the run id, e.g. for RUN=$(ledgerflow workflows start ...)."
)
@click.pass_context
def start(
    ctx: click.Context,
    workflow: str,
    input_json: str | None,
    key: str | None,
    idempotency_key: str | None,
    tenant: str,
    priority: int | None,
    debounce_key: str | None,
    debounce_window: float | None,
    debounce_max_wait: float | None,
    tags: tuple[str, ...],
    print_id: bool,
) -> None:
    """Start a run of WORKFLOW (workers pick it up); with --key, at most one active run per key; with
    --debounce-key and --debounce-window, one run per burst of starts, after the burst."""
    from eventstore import open_store
    from ops.cli.common import console
    from workflows import Debounce, Engine, tag_filter

    settings = settings_of(ctx)
    debounce = None
    if (debounce_key is None) != (debounce_window is None) or (debounce_max_wait and not debounce_key):
        raise click.UsageError(
            "--debounce-key and --debounce-window go together (--debounce-max-wait with them)"
        )
    if debounce_key is not None and debounce_window is not None:
        debounce = Debounce(debounce_key, debounce_window, debounce_max_wait)
    with open_store(settings) as store:
        started = Engine(store, registry_of(settings)).start(
            workflow,
            input=_json_arg(input_json),
            key=key,
            idempotency_key=idempotency_key,
            tenant=tenant,
            priority=priority,
            debounce=debounce,
            tags=dict(tag_filter(tags)) or None,
        )
    if print_id:
        click.echo(str(started.run_id))
        return
    if started.debounced_until is not None:
        opened = "opened a burst" if started.created else "joined its burst"
        console.print(
            f"run {started.run_id}: {opened}; it starts at {started.debounced_until.isoformat()} at the "
            "earliest",
            highlight=False,
        )
        return
    what = "started" if started.created else "already active (returned the existing run)"
    console.print(f"run {started.run_id} {what}", highlight=False)


@workflows_group.command("show")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--outputs", is_flag=True, help="Also every node's output (with --json: in each node's entry).")
@click.pass_context
def show(ctx: click.Context, run_id: str, tenant: str, as_json: bool, outputs: bool) -> None:
    """A run and every node's status and progress, straight from its events."""
    from eventstore import open_store
    from ops.cli.common import console
    from ops.cli.outputs import node_outputs, print_outputs
    from workflows import Engine, release_of

    settings = settings_of(ctx)
    with open_store(settings) as store:
        run = Engine(store, registry_of(settings)).load(_run_id(run_id), tenant=tenant)
        released = release_of(store, run.run_id, tenant=tenant)
    if as_json:
        shown = run_as_dict(run)
        for name, output in node_outputs(run).items() if outputs else ():
            shown["nodes"][name]["output"] = output
        shown["released"] = (
            {"at": released.released_at.isoformat(), "actor": released.actor} if released else None
        )
        emit_json(shown)
        return
    console.print(
        f"run {run.run_id} ({run.workflow}) [bold]{run.status}[/]"
        f"{' (cancel requested)' if run.cancel_requested and run.active else ''}",
        highlight=False,
    )
    if run.parent is not None:
        console.print(
            f"child of run {run.parent.run_id} (its node {run.parent.node}; "
            f"on the parent's end: {run.parent.parent_close})",
            highlight=False,
        )
    if run.continued_from is not None:
        console.print(f"continued_from: {run.continued_from}", highlight=False)
    if run.continued_as is not None:
        console.print(f"continued_as: {run.continued_as}", highlight=False)
    if run.triggered_by is not None:
        by = run.triggered_by
        console.print(
            f"started by event {by.event_id} ({by.type} in {by.stream_id}, "
            f"cursor {by.transaction_id}:{by.position})",
            highlight=False,
        )
    if released is not None:
        at = released.released_at.isoformat()
        console.print(f"released by retention at {at} (by {released.actor}): not listed", highlight=False)
        console.print(f"restore it: ledgerflow workflows restore {run.run_id}", highlight=False)
    console.print(node_table(run))
    if outputs:
        print_outputs(run)
    if run.error:
        console.print(f"[red]{run.error}[/]")


@workflows_group.command("wait")
@click.argument("run_id")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait at most.")
@click.option(
    "--follow",
    is_flag=True,
    help="If the run continues as a new run (continue_as_new), wait for its successors too, to the last "
    "run of the chain, and exit as that one ended.",
)
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def wait(ctx: click.Context, run_id: str, timeout: float, follow: bool, tenant: str) -> None:
    """Wait until a run ends; exit status 0 if it succeeded, 1 if it failed or was cancelled, 2 on timeout,
    3 if it continued as a new run (its successor is printed; `--follow` waits for the chain's last run).

    Handy in scripts: start a run, wait for it, then refresh or read its outputs."""
    from eventstore import open_store
    from ops.cli.common import console, err_console
    from workflows import Engine

    settings = settings_of(ctx)
    wanted = _run_id(run_id)
    with open_store(settings) as store:
        engine = Engine(store, registry_of(settings))
        run = _wait_for_end(engine, wanted, tenant, timeout, follow=follow)
    console.print(f"run {run.run_id} ({run.workflow}) [bold]{run.status}[/]", highlight=False)
    if run.continued_from is not None and follow and run.run_id != wanted:
        console.print(f"continued_from: {run.continued_from}", highlight=False)
    if run.active:
        err_console.print(f"still {run.status} after {timeout:g}s", highlight=False)
        ctx.exit(2)
    if run.error:
        console.print(f"[red]{run.error}[/]", highlight=False)
    if run.continued_as is not None:  # it handed over to its successor: wait for that one next
        console.print(f"continued_as: {run.continued_as}", highlight=False)
    ctx.exit(_WAIT_EXITS.get(run.status, 1))


#: `workflows wait`'s exit status per status of the run it ends with (any other: 1).
_WAIT_EXITS = {"succeeded": 0, "continued": 3}


def _wait_for_end(
    engine: Engine, run_id: uuid.UUID, tenant: str, timeout: float, *, follow: bool
) -> RunState:
    """The run once it has ended, or as it is when `timeout` runs out; with `follow`, the last run of its
    continue_as_new chain once that has ended (one deadline for the chain). Reading a run's stream now and
    then is cheap (workers only read newer events), and needs no listener of its own."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        run = engine.load(run_id, tenant=tenant)
        if follow and run.continued_as is not None:
            run_id, delay = uuid.UUID(run.continued_as), 0.05  # its successor started with its end
            continue
        if not run.active or time.monotonic() >= deadline:
            return run
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)


#: A waiting node (a timer, or a signal that has not come) beside the other states.
_ICONS = {**ICONS, "waiting": "[blue]◷[/]"}


def waiting_note(n: NodeState) -> str:
    """What a waiting node waits for and until when, in words; "" for a node that does not wait."""
    if n.status != "waiting":
        return ""
    until = n.wake_at.isoformat(timespec="seconds") if n.wake_at else None
    if n.waiting_for is None:
        return f"sleeping until {until}" if until else "sleeping"
    return f"waiting for signal {n.waiting_for}" + (f" until {until}" if until else "")


def node_table(run: RunState) -> Table:
    from rich.table import Table

    table = Table("", "node", "status", "attempt", "progress", "message / error")
    for name, n in run.nodes.items():
        progress = f"{n.progress[0]}/{n.progress[1]}" if n.progress and n.progress[1] else ""
        note = n.error or waiting_note(n) or (n.progress[2] if n.progress else "")
        table.add_row(_ICONS.get(n.status, "?"), name, str(n.status), str(n.attempt), progress, note[:70])
    return table


def run_as_dict(run: RunState) -> dict[str, Any]:
    return {
        "run_id": str(run.run_id),
        "workflow": run.workflow,
        "key": run.key,
        "triggered_by": run.triggered_by.model_dump() if run.triggered_by is not None else None,
        "parent": run.parent.model_dump() if run.parent is not None else None,
        "continued_from": run.continued_from,
        "continued_as": run.continued_as,
        "priority": run.priority,
        "status": run.status,
        "cancel_requested": run.cancel_requested,
        "error": run.error,
        "version": run.version,
        "nodes": {
            name: {
                "status": str(n.status),
                "attempt": n.attempt,
                "generation": n.generation,
                "progress": list(n.progress) if n.progress else None,
                "error": n.error,
                "checkpoints": len(n.checkpoints),
                "steps": len(n.steps),
                "crashes": n.crashes,
                "waiting_for": n.waiting_for,
                "wake_at": n.wake_at.isoformat() if n.wake_at else None,
            }
            for name, n in run.nodes.items()
        },
    }


@workflows_group.command("schedules")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for programs.")
@click.pass_context
def list_schedule_rows(ctx: click.Context, as_json: bool) -> None:
    """Every schedule a worker has seen: its workflow, cron, catch-up policy, last tick (the latest one
    dealt with: started, or passed over) and next tick (the first after it; one long past means no worker
    keeps the schedule)."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from workflows import list_schedules, next_tick

    with open_store(settings_of(ctx)) as store:
        rows = list_schedules(store)
    if as_json:
        emit_json(
            [
                {
                    "tenant": r.tenant,
                    "workflow": r.workflow,
                    "cron": r.cron,
                    "catch_up": r.catch_up,
                    "last_tick": r.last_tick.astimezone(UTC).isoformat(),
                    "next_tick": next_tick(r.cron, r.last_tick).isoformat(),
                    "last_run_id": str(r.last_run_id) if r.last_run_id else None,
                    "ticks_started": r.ticks_started,
                    "ticks_skipped": r.ticks_skipped,
                }
                for r in rows
            ]
        )
        return
    if not rows:
        console.print("no schedules yet; a worker records each scheduled workflow's schedule when it starts")
        return
    table = Table("workflow", "tenant", "cron", "catch-up", "last tick (UTC)", "next tick (UTC)")
    for r in rows:
        table.add_row(
            r.workflow,
            r.tenant,
            r.cron,
            r.catch_up,
            f"{r.last_tick.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
            f"{next_tick(r.cron, r.last_tick):%Y-%m-%d %H:%M:%S}",
        )
    console.print(table)


def _action(ctx: click.Context, run_id: str, tenant: str, action: str, **kwargs: Any) -> Any:
    from eventstore import open_store
    from workflows import Engine

    settings = settings_of(ctx)
    with open_store(settings) as store:
        engine = Engine(store, registry_of(settings))
        return getattr(engine, action)(_run_id(run_id), tenant=tenant, **kwargs)


@workflows_group.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.option("--data", default=None, help="The signal's payload, JSON (default: null).")
@click.option("--idempotency-key", default=None, help="Makes a retry of this signal safe.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for programs.")
@click.pass_context
def signal_run(
    ctx: click.Context,
    run_id: str,
    name: str,
    data: str | None,
    idempotency_key: str | None,
    tenant: str,
    as_json: bool,
) -> None:
    """Send signal NAME to a run: the node waiting for it (`ctx.wait_for_signal`) gets --data; sent
    before a node waits, it is kept for the first that does."""
    from eventstore.spi import json_loads
    from ops.cli.common import console

    try:
        # Numbers keep their exact decimal value, as in an append.
        payload = None if data is None else json_loads(data)
    except ValueError as exc:
        raise click.BadParameter(f"--data takes JSON: {exc}") from None
    sent = _action(
        ctx,
        run_id,
        tenant,
        "signal",
        name=name,
        payload=payload,
        idempotency_key=idempotency_key,
        actor="cli",
    )
    if as_json:
        emit_json(dataclasses.asdict(sent))
        return
    note = " (duplicate: the first send's answer; nothing recorded)" if sent.duplicate else ""
    what = f"signal {name} sent to run {sent.run_id} at position {sent.position}"
    console.print(what + note, highlight=False)


@workflows_group.command("cancel")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def cancel(ctx: click.Context, run_id: str, tenant: str) -> None:
    from ops.cli.common import console

    run = _action(ctx, run_id, tenant, "cancel")
    state = "cancelled" if not run.active else "cancel requested; running nodes stop at their next call"
    console.print(f"run {run_id}: {state}")


@workflows_group.command("pause")
@click.argument("run_id")
@click.option(
    "--interrupt-running",
    is_flag=True,
    help="Stop the running nodes at their next context call (they go on from their checkpoints on resume).",
)
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def pause(ctx: click.Context, run_id: str, interrupt_running: bool, tenant: str) -> None:
    """Pause a run: it starts no new node until `workflows resume`; its running nodes finish."""
    from ops.cli.common import console

    run = _action(ctx, run_id, tenant, "pause", interrupt_running=interrupt_running, actor="cli")
    running = [n.name for n in run.nodes.values() if n.status == "running"]
    then = (
        f"; running: {', '.join(running)} ({'stop at their next call' if interrupt_running else 'finish'})"
        if running
        else ""
    )
    console.print(f"run {run_id}: paused{then}", highlight=False)


@workflows_group.command("resume")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def resume(ctx: click.Context, run_id: str, tenant: str) -> None:
    """Resume a paused run where it was; completed nodes and memoized steps are not run again."""
    from ops.cli.common import console

    run = _action(ctx, run_id, tenant, "resume", actor="cli")
    console.print(f"run {run_id}: {run.status}", highlight=False)


@workflows_group.command("retry")
@click.argument("run_id")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def retry(ctx: click.Context, run_id: str, tenant: str) -> None:
    """Resume a failed run from its failed nodes; completed nodes are kept."""
    from ops.cli.common import console

    _action(ctx, run_id, tenant, "retry")
    console.print(f"run {run_id} resumes from its failed nodes")


@workflows_group.command("refresh")
@click.argument("run_id")
@click.option("--input", "input_json", default=None, help="The new input, JSON.")
@click.option("--tenant", default="default", show_default=True)
@click.pass_context
def refresh(ctx: click.Context, run_id: str, input_json: str | None, tenant: str) -> None:
    """Re-run a completed run with new input: only what changed, and what depends on it."""
    from ops.cli.common import console

    rerun = _action(ctx, run_id, tenant, "refresh", input=_json_arg(input_json))
    console.print(f"re-running {', '.join(sorted(rerun))}" if rerun else "nothing changed; nothing to re-run")


@click.command("recover")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for programs.")
@click.pass_context
def recover(ctx: click.Context, as_json: bool) -> None:
    """Reclaim orphaned nodes now (workers also do this continuously) and show recent recoveries."""
    from rich.table import Table

    from eventstore import open_store
    from ops.cli.common import console
    from workflows import Engine, queue_summary, recent_recoveries, sweep

    settings = settings_of(ctx)
    registry = registry_of(settings)
    with open_store(settings) as store:
        report = sweep(
            Engine(store, registry),
            registry,
            worker_name=f"cli:{settings.worker_name}",
            instance=uuid.uuid4().hex[:12],
            trigger="operator",
        )
        with store.pool.connection() as conn:
            summary = queue_summary(conn)
            recent = recent_recoveries(conn, 10)
    if as_json:
        emit_json(
            {
                "report": dataclasses.asdict(report),
                "queue": dataclasses.asdict(summary),
                "recent": [dataclasses.asdict(r) for r in recent],
            }
        )
        return
    console.print(
        f"reclaimed {report.reclaimed}, parked {report.parked}, stuck {report.stuck} "
        f"in {report.duration_ms:.1f} ms; queue: {summary.ready} ready, {summary.running} running, "
        f"{summary.orphaned} orphaned, {summary.parked} parked"
    )
    table = Table("id", "when", "worker", "trigger", "found", "reclaimed", "parked", "stuck", "ms")
    for r in recent:
        table.add_row(
            str(r.id),
            str(r.started_at)[:19],
            r.worker,
            r.trigger,
            str(r.found),
            str(r.reclaimed),
            str(r.parked),
            str(r.stuck),
            f"{r.duration_ms:.1f}",
        )
    console.print(table)


@click.command("demo")
@click.option("--tables", default=38, show_default=True, help="Tables in the sample schema.")
@click.option("--llm-delay", default=0.15, show_default=True, help="Seconds per simulated LLM call.")
@click.option(
    "--crash-at",
    default=26,
    show_default=True,
    help="Kill the worker when column enrichment reaches this item (0: no crash).",
)
@click.option(
    "--approve-after",
    default=2.0,
    show_default=True,
    help="Seconds the review run waits for its approval before the demo sends it.",
)
@click.pass_context
def demo(ctx: click.Context, tables: int, llm_delay: float, crash_at: int, approve_after: float) -> None:
    """Run the six-node extraction pipeline with live progress; kill its worker mid-node and watch the
    run resume at the right item. Then an event starts a review run, which waits for an approval."""
    from ops.demo import run_demo

    run_demo(
        settings_of(ctx), tables=tables, llm_delay=llm_delay, crash_at=crash_at, approve_after=approve_after
    )

"""`ledgerflow workflows ...`: the group, and `start`, `show` and `schedules`.

The group's other commands live in modules of their own, listed in ops.cli.command_table and imported
when one is used: `wait` (ops.cli.run_wait), `signal` and the operator's actions (ops.cli.run_actions),
`list` and `history` (ops.cli.run_search), `bulk` (ops.cli.bulk), `retention` and `restore`
(ops.cli.retention). `ledgerflow worker` and `recover` are in ops.cli.worker, `demo` in ops.cli.demo.
"""

from __future__ import annotations

from datetime import UTC

import click

from ops.cli.command_table import WORKFLOWS_COMMANDS
from ops.cli.common import emit_json, settings_of
from ops.cli.lazy import LazyGroup
from ops.cli.run_args import json_arg, registry_of, run_id_arg
from ops.cli.run_views import node_table, run_as_dict

#: `workflows.PRIORITY_MIN` and `PRIORITY_MAX` (a PostgreSQL integer), here so that `--help` shows the range
#: without importing the engine; tests/unit/test_cli_lazy.py checks that they agree.
PRIORITIES = click.IntRange(-(2**31), 2**31 - 1)


@click.group("workflows", cls=LazyGroup, lazy=WORKFLOWS_COMMANDS)
def workflows_group() -> None:
    """Start, list, show, signal, pause, resume, cancel, retry and refresh workflow runs.

    `ledgerflow workflows schedules` lists the schedules with their cron, catch-up, last and next tick."""


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
            input=json_arg(input_json),
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
        run = Engine(store, registry_of(settings)).load(run_id_arg(run_id), tenant=tenant)
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

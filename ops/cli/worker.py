"""`ledgerflow worker` and `ledgerflow recover`: run a workflow worker; reclaim orphaned nodes now."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING

import click

from ops.cli.common import emit_json, settings_of
from ops.cli.run_args import registry_of

if TYPE_CHECKING:
    from ops.settings import Settings
    from workflows import WorkerSettings


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
        with store.connection() as conn:
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

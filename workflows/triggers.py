"""Event-triggered starts: a workflow declared with `triggers=[Trigger(...)]` gets one run per matching
event of the log.

Each triggered workflow has its own projection, `trigger_<workflow>`, a durable consumer of the log like
any other: its cursor, its lease (one applier at a time across every worker), its runs and its failure
records are the projector's (`projector.ProjectorWorker`), and so are its guarantees. Applying an event
starts the run, in the event's tenant, inside the transaction that advances the cursor, and records the
event's row in the projection's table there too: a crash at any moment leaves both the run and the
cursor's move, or neither, so a start is never lost nor doubled. The start also carries the idempotency
key `trigger:<workflow>:<event id>`, a second guard: an event applied again (a replay, a rebuild, a
stale applier that lost its lease mid-batch) returns the run already started.

The consumer reads the log from its beginning: every matching event starts a run, those appended before
the trigger was declared or while no worker ran included. `ledgerflow worker` runs the consumers of the
workflows it knows (`TriggerConsumer`), so triggers need no other process.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from opentelemetry import metrics
from psycopg import sql

from eventstore import RecordedEvent
from eventstore.spi import Outage, fetch_value, is_unavailable, load_queries
from projector import ApplyContext, Projection, ProjectorWorker, Table
from projector import WorkerSettings as ProjectorSettings
from workflows import event_models as em
from workflows.children import children_projection
from workflows.definition import Workflow
from workflows.engine import Engine
from workflows.run_sources import Trigger
from workflows.workflow_registry import WorkflowRegistry

log = structlog.get_logger(__name__)
_meter = metrics.get_meter("ledgerflow.workflows")
_runs_triggered = _meter.create_counter(
    "ledgerflow.workflow.runs_triggered", description="Runs started by events of the log, by workflow"
)
_trigger_delay = _meter.create_histogram(
    "ledgerflow.workflow.trigger_delay",
    unit="ms",
    description="From an event's append to the start of the run it triggers (the worker's clock)",
)
Q = load_queries("workflows", "triggers.sql")
_NOTIFY = load_queries("eventstore")["notify"]
_PREFIX = "trigger_"
#: Projection names allow 41 characters; longer workflow names are cut and told apart by a hash.
_MAX_NAME = 41
#: Events per transaction of a trigger's cursor. The transaction holds the lease row, and a start is a few
#: round trips (some 25 ms on a loaded machine): a small batch commits well within the shortest lease, so
#: the lease is renewed on time and no peer takes it over mid-batch.
_BATCH = 10
#: Seconds before a consumer that ended on an unexpected error is replaced.
_RESTART_AFTER = 1.0


def projection_name(workflow: str) -> str:
    """The trigger projection of `workflow`: stable, and distinct for distinct workflow names."""
    name = _PREFIX + workflow
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(workflow.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"


def matches(trigger: Trigger, event: RecordedEvent) -> bool:
    return event.type == trigger.event_type and trigger.category in (None, event.category)


def trigger_input(event: RecordedEvent) -> dict[str, Any]:
    """A triggered run's input: the event's data and where it is in the log."""
    return {
        "event_id": str(event.event_id),
        "stream_id": event.stream_id,
        "stream_version": event.stream_version,
        "type": event.type,
        "data": event.data,
        "metadata": event.metadata,
        "recorded_at": event.recorded_at.isoformat(),
        "cursor": str(event.cursor),
    }


def idempotency_key(workflow: str, event: RecordedEvent) -> str:
    return f"trigger:{workflow}:{event.event_id}"


def triggering_event(event: RecordedEvent) -> em.TriggeringEvent:
    return em.TriggeringEvent(
        event_id=str(event.event_id),
        stream_id=event.stream_id,
        type=event.type,
        transaction_id=event.transaction_id,
        position=event.position,
    )


def trigger_projection(engine: Engine, wf: Workflow) -> Projection:
    """The consumer that starts `wf`'s runs for the events its triggers match."""
    name = projection_name(wf.name)
    triggers = wf.triggers
    projection = Projection(
        name=name,
        version=1,
        tables=[Table(name, Q["create_starts"])],
        event_types=sorted({t.event_type for t in triggers}),
        per_tenant=True,  # an event of tenant A starts a run of tenant A, recorded in A's rows
        replay_in_place=True,  # a re-applied event finds its run (the key) and its row (ON CONFLICT)
        # A start that keeps failing parks its stream for an operator; other streams go on starting runs.
        failure_policy="park",
    )

    @projection.on_batch
    def start_runs(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
        rows = []
        for event in events:
            if not any(matches(t, event) for t in triggers):
                continue
            try:
                started = engine.start(
                    wf.name,
                    input=trigger_input(event),
                    idempotency_key=idempotency_key(wf.name, event),
                    tenant=event.tenant,
                    triggered_by=triggering_event(event),
                    conn=ctx.conn,  # in the transaction that moves the cursor: a start commits with it
                )
            except Exception as exc:
                if is_unavailable(exc):
                    # The runner takes a driver's OperationalError for the database going away (the
                    # worker waits it out), any other error for the handler's own failure (retried, then
                    # recorded): an outage must not become a failure record.
                    raise psycopg.OperationalError(str(exc)) from exc
                raise
            if started.created:
                _runs_triggered.add(1, {"workflow": wf.name})
                delay = (datetime.now(UTC) - event.recorded_at).total_seconds() * 1000
                _trigger_delay.record(max(0.0, delay), {"workflow": wf.name})
                log.info(
                    "workflow_triggered",
                    workflow=wf.name,
                    run_id=str(started.run_id),
                    event_id=str(event.event_id),
                    cursor=str(event.cursor),
                    tenant=event.tenant,
                )
            rows.append((event.tenant, event.event_id, started.run_id, event.transaction_id, event.position))
        if rows:
            with ctx.conn.cursor() as cur:
                cur.executemany(sql.SQL(Q["record_start"]).format(table=ctx.table(name)), rows)
            # Workers claim the new runs' nodes as soon as this commits: a NOTIFY is delivered at commit,
            # and only then (one per batch; appenders never wait for it).
            ctx.conn.execute(_NOTIFY)

    return projection


def run_started_by(
    conn: psycopg.Connection[Any], workflow: str, event_id: uuid.UUID, *, tenant: str = "default"
) -> uuid.UUID | None:
    """The run of `workflow` that the event `event_id` started, or None while its trigger has not applied
    it (its consumer may not have made its table yet, either)."""
    table = sql.Identifier("ledgerflow", projection_name(workflow))
    try:
        with conn.transaction():
            run_id = fetch_value(conn, sql.SQL(Q["started_by"]).format(table=table), (tenant, event_id))
    except psycopg.errors.UndefinedTable:
        return None
    return None if run_id is None else uuid.UUID(str(run_id))


def trigger_projections(engine: Engine, registry: WorkflowRegistry) -> list[Projection]:
    return [
        trigger_projection(engine, wf) for wf in (registry.get(n) for n in registry.names()) if wf.triggers
    ]


class TriggerConsumer:
    """The trigger projections of a registry's workflows, applied by a projector worker in a thread of
    the workflow worker. Its leases share the work with other workers' consumers: one applies each
    workflow's triggers at a time, and another takes over when it dies."""

    def __init__(
        self,
        engine: Engine,
        registry: WorkflowRegistry,
        *,
        worker_id: str,
        lease_ttl: float = 10.0,
        outage: Outage | None = None,
    ) -> None:
        self._outage = outage
        # Beside the triggers, the projection by which child runs follow their parents (workflows.children).
        self._projections = [*trigger_projections(engine, registry), children_projection(engine)]
        self._store = engine.store
        self._worker_id = f"{worker_id}/triggers"
        # The leases last as long as the workflow worker's node leases: a peer takes over a dead
        # worker's triggers as soon as it would take over its nodes.
        self._settings = ProjectorSettings(
            lease_ttl=lease_ttl, heartbeat_interval=lease_ttl / 3, batch_size=_BATCH
        )
        self._worker: ProjectorWorker | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._projections and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledgerflow-triggers", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        # A projector worker outlives the database's outages and its projections' failures by itself;
        # anything else that ends it (a bug) is logged, and a new one takes over after a pause, so that
        # this worker does not stop starting runs for good.
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                self._worker = ProjectorWorker(
                    self._store,
                    self._projections,
                    self._settings,
                    worker_id=self._worker_id,
                    outage=self._outage,
                    listener_name="ledgerflow-workflow-projections",
                )
            try:
                self._worker.run()
            except Exception:
                log.exception("workflow_triggers_failed", retry_in=_RESTART_AFTER)
                self._stopping.wait(_RESTART_AFTER)

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping.set()
            if self._worker is not None:
                self._worker.stop()
        if self._thread is not None:
            self._thread.join(timeout)

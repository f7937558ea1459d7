"""Recovery of orphaned work: nodes whose worker died, nodes of this worker's previous life, and stuck
nodes. Runs at worker start-up and then continuously; every sweep that finds something is recorded
(found, reclaimed, parked, stuck, failed, duration) and counted in metrics.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from opentelemetry import trace

from eventstore import ANY, NewEvent, StreamAppend
from workflows import events as ev
from workflows import metrics, queue
from workflows.definition import WorkflowRegistry
from workflows.engine import Engine
from workflows.errors import NodeStuckError
from workflows.lifecycle import Lifecycle
from workflows.queue import Claim

log = structlog.get_logger(__name__)
_tracer = trace.get_tracer("ledgerflow.workflows")
_BATCH = 1000


@dataclass(frozen=True)
class RecoveryReport:
    found: int
    reclaimed: int
    parked: int
    stuck: int
    failed: int
    duration_ms: float


def sweep(
    engine: Engine, registry: WorkflowRegistry, *, worker_name: str, instance: str, trigger: str = "periodic"
) -> RecoveryReport:
    """Reclaim lapsed and restarted-worker nodes, and act on stuck ones. Exactly one recoverer takes each
    node (the queue hands rows out with SKIP LOCKED inside the transaction that records the reclaim)."""
    with _tracer.start_as_current_span(
        "ledgerflow.recovery", attributes={"ledgerflow.trigger": trigger}
    ) as span:
        report = _sweep(engine, registry, worker_name=worker_name, instance=instance, trigger=trigger)
        span.set_attributes(
            {
                "ledgerflow.found": report.found,
                "ledgerflow.reclaimed": report.reclaimed,
                "ledgerflow.parked": report.parked,
                "ledgerflow.stuck": report.stuck,
            }
        )
    return report


def _sweep(
    engine: Engine, registry: WorkflowRegistry, *, worker_name: str, instance: str, trigger: str
) -> RecoveryReport:
    began, started_at = time.monotonic(), datetime.now(UTC)
    reclaimed = parked = stuck_count = failed = found = 0
    while True:
        with engine.transaction() as conn:
            taken = queue.reclaim(conn, worker_name=worker_name, instance=instance, limit=_BATCH)
            by_tenant: dict[str, dict[str, list[NewEvent]]] = defaultdict(lambda: defaultdict(list))
            for r in taken:
                if r.status == "parked":
                    e = ev.event(
                        ev.NODE_PARKED,
                        r.run_id,
                        node=r.node,
                        crashes=r.crashes,
                        error=f"crashed {r.crashes} times; parked for an operator",
                    )
                else:
                    e = ev.event(
                        ev.NODE_RECLAIMED,
                        r.run_id,
                        node=r.node,
                        attempt=r.attempt,
                        previous_worker=r.previous_worker,
                        reason=r.reason,
                    )
                by_tenant[r.tenant][ev.run_stream(r.run_id)].append(e)
            for tenant, streams in by_tenant.items():
                engine.store.append_many(
                    [StreamAppend(s, es, ANY) for s, es in streams.items()], tenant=tenant, conn=conn
                )
        found += len(taken)
        parked += sum(r.status == "parked" for r in taken)
        reclaimed += sum(r.status != "parked" for r in taken)
        for r in taken:
            log.warning(
                "workflow_node_reclaimed" if r.status != "parked" else "workflow_node_parked",
                run_id=str(r.run_id),
                node=r.node,
                previous_worker=r.previous_worker,
                reason=r.reason,
                crashes=r.crashes,
            )
        if len(taken) < _BATCH:
            break
    stuck_count, failed = _stuck(engine, registry)
    found += stuck_count
    report = RecoveryReport(
        found, reclaimed, parked, stuck_count, failed, round((time.monotonic() - began) * 1000, 3)
    )
    if found or trigger == "startup":
        with engine.store.pool.connection() as conn:
            queue.record_recovery(
                conn,
                worker=f"{worker_name}/{instance}",
                trigger=trigger,
                started_at=started_at,
                duration_ms=report.duration_ms,
                found=report.found,
                reclaimed=report.reclaimed,
                parked=report.parked,
                stuck=report.stuck,
                failed=report.failed,
            )
        log.info("workflow_recovery", trigger=trigger, **report.__dict__)
    metrics.record_recovery(report, trigger)
    return report


def _stuck(engine: Engine, registry: WorkflowRegistry) -> tuple[int, int]:
    """Nodes that heartbeat but report nothing past their deadline: flagged, then retried or failed."""
    with engine.transaction() as conn:
        found = queue.stuck(conn, _BATCH)
        for s in found:
            if s.action == "retry":
                engine.store.append_many(
                    [
                        StreamAppend(
                            ev.run_stream(s.run_id),
                            [
                                ev.event(
                                    ev.NODE_STUCK,
                                    s.run_id,
                                    node=s.node,
                                    seconds=round(s.seconds, 3),
                                    action="retry",
                                ),
                                ev.event(
                                    ev.NODE_RECLAIMED,
                                    s.run_id,
                                    node=s.node,
                                    attempt=s.attempt,
                                    previous_worker=s.worker,
                                    reason="stuck",
                                ),
                            ],
                            ANY,
                        )
                    ],
                    tenant=s.tenant,
                    conn=conn,
                )
            else:
                engine.store.append(
                    ev.run_stream(s.run_id),
                    [
                        ev.event(
                            ev.NODE_STUCK, s.run_id, node=s.node, seconds=round(s.seconds, 3), action="fail"
                        )
                    ],
                    tenant=s.tenant,
                    conn=conn,
                )
    failed = 0
    lifecycle = Lifecycle(engine)
    for s in found:
        log.warning(
            "workflow_node_stuck", run_id=str(s.run_id), node=s.node, action=s.action, worker=s.worker
        )
        if s.action == "fail" and s.token is not None:
            run = engine.load(s.run_id, tenant=s.tenant)
            wf = registry.get(run.workflow)
            claim = Claim(s.run_id, s.node, s.tenant, run.workflow, s.attempt, s.token, False, 0)
            error = NodeStuckError(f"no progress for longer than the deadline of node {s.node!r}")
            if not lifecycle.failed(claim, wf, error):
                failed += 1
    return len(found), failed

"""Recovery of orphaned work: nodes whose worker died, nodes of this worker's previous life, and stuck
nodes. Runs at worker start-up, whenever the presence watch sees a peer's session gone
(`workflows.presence`), and periodically; every sweep that finds something is recorded (found,
reclaimed, parked, stuck, failed, duration) and counted in metrics.

A sweep is set-based whatever it finds: one statement takes back up to a thousand nodes, and their
NodeReclaimed/NodeParked events go to the run streams in one append per tenant, in the same transaction.
`take_back` also claims the nodes it takes back for the worker that recovers them (NodeClaimed in the same
append) and hands them over batch by batch, the first batch small: a restarted worker, or a peer taking
a dead one over, starts the first nodes while the rest are still being taken back.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from opentelemetry import trace
from psycopg.rows import class_row

from eventstore import ANY, NewEvent, StreamAppend
from eventstore.spi import load_queries
from workflows import events as ev
from workflows import metrics
from workflows import new_events as new
from workflows.engine import Engine
from workflows.errors import NodeStuckError
from workflows.lifecycle import Lifecycle
from workflows.node_end_writes import claimed_event
from workflows.queue_claims import Claim, Claimant, WorkflowVersion
from workflows.workflow_registry import WorkflowRegistry

log = structlog.get_logger(__name__)
_tracer = trace.get_tracer("ledgerflow.workflows")
Q = load_queries("workflows", "recovery.sql")
Conn = psycopg.Connection[Any]
_BATCH = 1000
#: The first batch of a sweep is small: its nodes start while the rest are being taken back.
_FIRST_BATCH = 100
#: Claims taken back, handed to the worker as each batch commits.
StartClaims = Callable[[list[Claim]], object]


@dataclass(frozen=True)
class RecoveryReport:
    found: int
    reclaimed: int
    parked: int
    stuck: int
    failed: int
    duration_ms: float


@dataclass(frozen=True)
class Reclaimed:
    """A node taken back from a holder that is gone: ready again, parked, or claimed for the recoverer."""

    run_id: uuid.UUID
    node: str
    tenant: str
    workflow: str
    #: The attempt its holder lost.
    lost_attempt: int
    crashes: int
    status: str
    previous_worker: str | None
    #: worker_restarted, worker_gone (its presence ended) or lease_expired
    reason: str
    #: Set when claimed for the recoverer: its fencing token.
    token: int | None
    cancel_requested: bool
    #: The definition's version the run started with.
    version: str = "1"

    def claim(self) -> Claim | None:
        if self.status != "claimed" or self.token is None:
            return None
        return Claim(
            self.run_id,
            self.node,
            self.tenant,
            self.workflow,
            self.lost_attempt + 1,
            self.token,
            self.cancel_requested,
            self.crashes,
            self.version,
        )

    def events(self, worker_id: str) -> list[NewEvent]:
        if self.status == "parked":
            return [
                new.node_parked(
                    run_id=self.run_id,
                    node=self.node,
                    crashes=self.crashes,
                    error=f"crashed {self.crashes} times; parked for an operator",
                )
            ]
        reclaimed = new.node_reclaimed(
            run_id=self.run_id,
            node=self.node,
            attempt=self.lost_attempt,
            previous_worker=self.previous_worker,
            reason=self.reason,
        )
        claim = self.claim()
        return [reclaimed] if claim is None else [reclaimed, claimed_event(claim, worker_id)]


@dataclass(frozen=True)
class Stuck:
    run_id: uuid.UUID
    node: str
    tenant: str
    attempt: int
    action: str
    token: int | None
    worker: str | None
    seconds: float

    def events(self) -> list[NewEvent]:
        stuck = new.node_stuck(
            run_id=self.run_id, node=self.node, seconds=round(self.seconds, 3), action=self.action
        )
        if self.action != "retry":
            return [stuck]
        reclaimed = new.node_reclaimed(
            run_id=self.run_id,
            node=self.node,
            attempt=self.attempt,
            previous_worker=self.worker,
            reason="stuck",
        )
        return [stuck, reclaimed]


def reclaim(
    conn: Conn,
    *,
    worker_name: str,
    instance: str,
    limit: int = _BATCH,
    claim_for: Claimant | None = None,
    workflows: Sequence[WorkflowVersion] = (),
    slots: int = 0,
) -> list[Reclaimed]:
    """In the caller's transaction: take back the nodes whose holder is gone (see `reclaim` in
    recovery.sql), up to `slots` of them, of `workflows`, claimed for `claim_for`; and forget the
    presence of processes with nothing left to take back."""
    params = {
        "worker_name": worker_name,
        "instance": instance,
        "limit": limit,
        "claim_workflows": [name for name, _ in workflows] if claim_for else [],
        "claim_versions": [version for _, version in workflows] if claim_for else [],
        "claim_slots": slots if claim_for else 0,
        "ttl": claim_for.ttl if claim_for else 0.0,
    }
    with conn.cursor(row_factory=class_row(Reclaimed)) as cur:
        taken = cur.execute(Q["reclaim"], params).fetchall()
    if len(taken) < limit:
        conn.execute(Q["forget_departed"])
    return taken


def find_stuck(conn: Conn, limit: int = _BATCH) -> list[Stuck]:
    with conn.cursor(row_factory=class_row(Stuck)) as cur:
        return cur.execute(Q["stuck"], {"limit": limit}).fetchall()


def append_per_run(engine: Engine, conn: Conn, events: Iterable[tuple[str, uuid.UUID, NewEvent]]) -> None:
    """Append (tenant, run id, event) triples to their run streams: one append per tenant, whatever the
    number of runs."""
    by_tenant: dict[str, dict[str, list[NewEvent]]] = defaultdict(lambda: defaultdict(list))
    for tenant, run_id, event in events:
        by_tenant[tenant][ev.run_stream(run_id)].append(event)
    for tenant, streams in by_tenant.items():
        engine.store.append_many(
            [StreamAppend(s, es, ANY) for s, es in streams.items()], tenant=tenant, conn=conn
        )


def sweep(
    engine: Engine, registry: WorkflowRegistry, *, worker_name: str, instance: str, trigger: str = "periodic"
) -> RecoveryReport:
    """Reclaim the nodes of gone, restarted and lapsed holders, and act on stuck ones. Exactly one
    recoverer takes each node (the queue hands rows out with SKIP LOCKED inside the transaction that
    records the reclaim)."""
    report, _ = _traced(engine, registry, worker_name, instance, trigger, None, (), 0, None)
    return report


def take_back(
    engine: Engine,
    registry: WorkflowRegistry,
    claimant: Claimant,
    *,
    slots: int,
    workflows: Sequence[WorkflowVersion] | None = None,
    trigger: str = "startup",
    start: StartClaims | None = None,
) -> tuple[RecoveryReport, list[Claim]]:
    """`sweep`, claiming up to `slots` of the reclaimed nodes for `claimant` in the same transaction
    (their NodeReclaimed and NodeClaimed events appended together): what a restarted worker, or a peer
    taking a dead one over, calls to run the nodes at once. `start` gets each batch's claims as soon as
    it commits (a first small batch, then up to a thousand at a time), so the first nodes run while the
    rest are taken back; without it, the caller starts the returned claims. Only nodes of `workflows`
    ((name, version) pairs; default: all the registry has) are claimed, and never a node with limits,
    which needs a slot of each (the claim loop admits it)."""
    return _traced(
        engine,
        registry,
        claimant.worker_name,
        claimant.instance,
        trigger,
        claimant,
        registry.name_versions() if workflows is None else workflows,
        slots,
        start,
    )


def _traced(
    engine: Engine,
    registry: WorkflowRegistry,
    worker_name: str,
    instance: str,
    trigger: str,
    claim_for: Claimant | None,
    workflows: Sequence[WorkflowVersion],
    slots: int,
    start: StartClaims | None,
) -> tuple[RecoveryReport, list[Claim]]:
    with _tracer.start_as_current_span(
        "ledgerflow.recovery", attributes={"ledgerflow.trigger": trigger}
    ) as span:
        report, claims = _sweep(
            engine, registry, worker_name, instance, trigger, claim_for, workflows, slots, start
        )
        span.set_attributes(
            {
                "ledgerflow.found": report.found,
                "ledgerflow.reclaimed": report.reclaimed,
                "ledgerflow.parked": report.parked,
                "ledgerflow.stuck": report.stuck,
                "ledgerflow.claimed": len(claims),
            }
        )
    return report, claims


def _sweep(
    engine: Engine,
    registry: WorkflowRegistry,
    worker_name: str,
    instance: str,
    trigger: str,
    claim_for: Claimant | None,
    workflows: Sequence[WorkflowVersion],
    slots: int,
    start: StartClaims | None,
) -> tuple[RecoveryReport, list[Claim]]:
    began, started_at = time.monotonic(), datetime.now(UTC)
    reclaimed = parked = stuck_count = failed = found = 0
    taken: list[Reclaimed] = []
    claims: list[Claim] = []
    worker_id = claim_for.worker_id if claim_for else f"{worker_name}/{instance}"

    def any_taken() -> bool:  # workers are woken (NOTIFY) only when nodes became ready
        return any(r.status == "ready" for r in taken)

    batch = _FIRST_BATCH
    while True:
        with engine.transaction(notify=any_taken) as conn:
            taken = reclaim(
                conn,
                worker_name=worker_name,
                instance=instance,
                limit=batch,
                claim_for=claim_for,
                workflows=workflows,
                slots=slots - len(claims),
            )
            append_per_run(
                engine, conn, ((r.tenant, r.run_id, e) for r in taken for e in r.events(worker_id))
            )
        claimed = [c for c in (r.claim() for r in taken) if c is not None]
        if claimed and start is not None:
            start(claimed)
        claims += claimed
        found += len(taken)
        parked += sum(r.status == "parked" for r in taken)
        reclaimed += sum(r.status != "parked" for r in taken)
        _log_taken(taken)
        if len(taken) < batch:
            break
        batch = _BATCH
    stuck_count, failed = _stuck(engine, registry)
    found += stuck_count
    report = RecoveryReport(
        found, reclaimed, parked, stuck_count, failed, round((time.monotonic() - began) * 1000, 3)
    )
    if claims:
        metrics.nodes_claimed.add(len(claims))
    if found or trigger == "startup":
        with engine.store.pool.connection() as conn:
            conn.execute(
                Q["record_recovery"],
                {
                    "worker": f"{worker_name}/{instance}",
                    "trigger": trigger,
                    "started_at": started_at,
                    **asdict(report),
                },
            )
        log.info("workflow_recovery", trigger=trigger, **asdict(report))
    metrics.record_recovery(report, trigger)
    return report, claims


def _log_taken(taken: list[Reclaimed]) -> None:
    """One warning per batch of nodes taken back (a takeover may take a thousand: a line each would cost
    the sweep a fifth of a second and bury the log), each node at debug level; a warning per parked node,
    which waits for an operator."""
    back = [r for r in taken if r.status != "parked"]
    if back:
        log.warning(
            "workflow_nodes_reclaimed",
            count=len(back),
            previous_workers=sorted({r.previous_worker or "" for r in back}),
            reasons=dict(Counter(r.reason for r in back)),
            claimed_here=sum(r.status == "claimed" for r in back),
        )
    for r in taken:
        (log.warning if r.status == "parked" else log.debug)(
            "workflow_node_parked" if r.status == "parked" else "workflow_node_reclaimed",
            run_id=str(r.run_id),
            node=r.node,
            previous_worker=r.previous_worker,
            reason=r.reason,
            crashes=r.crashes,
        )


def _stuck(engine: Engine, registry: WorkflowRegistry) -> tuple[int, int]:
    """Nodes that heartbeat but report nothing past their deadline: flagged, then retried or failed."""
    with engine.transaction(notify=lambda: bool(found)) as conn:
        found = find_stuck(conn)
        append_per_run(engine, conn, ((s.tenant, s.run_id, e) for s in found for e in s.events()))
    failed = 0
    lifecycle = Lifecycle(engine)
    for s in found:
        log.warning(
            "workflow_node_stuck", run_id=str(s.run_id), node=s.node, action=s.action, worker=s.worker
        )
        if s.action == "fail" and s.token is not None:
            run = engine.load(s.run_id, tenant=s.tenant)
            # Failing it needs only its retry policy: the newest version's serves when this worker lacks
            # the run's own.
            has_it = run.workflow_version in registry.versions(run.workflow)
            wf = registry.get(run.workflow, run.workflow_version if has_it else None)
            claim = Claim(
                s.run_id, s.node, s.tenant, run.workflow, s.attempt, s.token, False, 0, run.workflow_version
            )
            error = NodeStuckError(f"no progress for longer than the deadline of node {s.node!r}")
            if not lifecycle.failed(claim, wf, error):
                failed += 1
    return len(found), failed

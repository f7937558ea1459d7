"""How a node's end is written: the queue's side (the fence on the claim, the node's row, the newly
runnable nodes, and the successor the worker hands to itself, already claimed) and the run-stream events,
at the exact version the worker knows.

An end that leaves its run going does both in one statement, so one transaction and one round trip
(`_record`); so does the end of a run without a key, which also claims a ready node of another run for the
worker (the claim appends that node's NodeClaimed itself) and reads that run. The end of a run with a key,
which also releases the key in a stream of its own, and a suspension are one pipelined transaction of two
round trips (`_transact`). What to write is decided by `workflows.lifecycle.Lifecycle`, one decision per
kind of end, and decided again after a version conflict (`_commit`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import psycopg
import structlog

from eventstore import (
    AppendResult,
    ConflictError,
    EventStore,
    LedgerflowError,
    NewEvent,
    StreamAppend,
    WrongExpectedVersionError,
)
from eventstore.spi import EventRow
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_claims, queue_end_rows, queue_node_ends, queue_run_changes, snapshots
from workflows.cancelling import release_key_appends
from workflows.definition import Workflow
from workflows.engine import Engine
from workflows.errors import SQLSTATES, wrap_exceptions
from workflows.node_spec import NodeSpec
from workflows.queue_claims import Claim, Claimant
from workflows.quotas import TenantQuotas
from workflows.run_advance import WrittenJson, advance
from workflows.run_fold import apply
from workflows.run_state import RunState

log = structlog.get_logger(__name__)
#: How often an end decides again after its run changed under it before it gives up (ConflictError).
END_ATTEMPTS = 50
_TERMINAL = (ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED, ev.RUN_CONTINUED_AS_NEW)


def claimed_event(claim: Claim, worker_id: str) -> NewEvent:
    return new.node_claimed(
        run_id=claim.run_id, node=claim.node, attempt=claim.attempt, token=claim.token, worker=worker_id
    )


@contextmanager
def fenced_writes() -> Iterator[None]:
    """The error boundary of a fenced write: driver errors become ledgerflow errors, and the fence's
    SQLSTATEs the worker's signals (NodeLeaseLost, RunCancelled), also when a pipelined fence's error
    surfaced inside the event store's append (which translated it as an error of its own)."""
    try:
        with wrap_exceptions():
            yield
    except LedgerflowError as exc:
        cause = exc.__cause__
        if not isinstance(cause, psycopg.Error):
            raise
        translation = SQLSTATES.get(cause.sqlstate or "")
        if translation is None:
            raise
        raise translation(cause) from cause


def _suspended(recorded_at: Callable[[], datetime]) -> Callable[[], queue_end_rows.NodeEnded]:
    """A suspension's answer in the shape of a node end's: it claims no successor."""
    return lambda: queue_end_rows.NodeEnded(0, recorded_at())


def fence(conn: Any, claim: Claim, *, check_cancel: bool = True) -> None:
    """In `conn`'s transaction: fail with NodeLeaseLost unless `claim` still holds its node (and, with
    `check_cancel`, with RunCancelled if its run is being cancelled)."""
    with wrap_exceptions():
        queue_node_ends.fence(conn, claim.run_id, claim.node, claim.token, check_cancel=check_cancel)


@dataclass(frozen=True)
class Decision:
    """What a node's end records: the run-stream events, the queue's change, and the nodes made ready."""

    events: list[NewEvent]
    ready: list[str] = dataclasses.field(default_factory=list)
    #: Not None: the node runs again after this many seconds.
    retry_in: float | None = None
    #: Not None: the node does not end but waits (see Lifecycle.suspend).
    suspension: Suspension | None = None


@dataclass(frozen=True)
class Suspension:
    until: datetime | None
    #: Wake at once: what the node waits for came while it was deciding to wait.
    now: bool
    signal: str | None


def record_appended(
    store: EventStore, claims: list[Claim], appended: queue_claims.AppendedRows, began: float
) -> None:
    """What every append does after it (see `EventStore.appended`), for the NodeClaimed events a claim
    appended itself, per tenant."""
    by_tenant: dict[str, queue_claims.AppendedRows] = {}
    for claim, row in zip(claims, appended, strict=True):
        by_tenant.setdefault(claim.tenant, []).append(row)
    for tenant, rows in by_tenant.items():
        store.appended(rows, tenant, began)


class _QueueChange(TypedDict):
    """The queue's side of a node's end, as `queue_node_ends.end_node` and `queue_node_ends.record_node_end`
    take it."""

    retry_in: float | None
    ready: list[NodeSpec]
    attempts: dict[str, int]
    successor: queue_node_ends.Successor | None


def _hand_off(
    conn: Any,
    claim: Claim,
    wf: Workflow,
    run: RunState,
    decision: Decision,
    events: list[NewEvent],
    claim_next: Claimant | None,
) -> tuple[Claim | None, _QueueChange]:
    """The queue's change of a decision: the nodes it makes ready, unlimited ones first, and, with
    `claim_next`, the first of them claimed for the caller (its claim is returned; its NodeClaimed goes into
    `events`). The worker hands itself a node without limits only: one that needs a slot is admitted by the
    claim, which may defer it (a hand-over refused there would record a claim that nobody runs). Stable
    sort: unlimited nodes first, in their order."""
    ready = sorted(decision.ready, key=lambda n: bool(wf.nodes[n].limits))
    change = _QueueChange(
        retry_in=decision.retry_in,
        ready=[wf.nodes[n] for n in ready],
        attempts={n: run.node(n).attempt for n in ready},
        successor=None,
    )
    # A paused run starts no new node: its ready ones wait for the resume (the claim moves them aside).
    if claim_next is None or not ready or wf.nodes[ready[0]].limits or run.paused:
        return None, change
    node = ready[0]
    successor = Claim(
        claim.run_id,
        node,
        claim.tenant,
        wf.name,
        run.node(node).attempt + 1,
        claim_next.tokens.take(conn),
        cancel_requested=False,
        crashes=0,
        version=claim.version,
    )
    events.append(claimed_event(successor, claim_next.worker_id))
    return successor, {**change, "successor": queue_node_ends.Successor(claim_next, successor.token)}


class NodeEndWriter:
    """Writes the ends that `workflows.lifecycle.Lifecycle` decides."""

    def __init__(self, engine: Engine, *, quotas: TenantQuotas | None = None) -> None:
        self.engine = engine
        self.store = engine.store
        #: The tenants' quotas a continue_as_new successor counts against (default: the engine's).
        self.quotas = quotas if quotas is not None else engine.quotas
        # Events the hand-over of ledgerflow.wf_record_run_end reads after the claimed run's snapshot. The
        # projection keeps snapshots within about `run_snapshot_every` events of a run's end; a run further
        # behind (the projection stopped) is loaded by the worker itself, which writes a snapshot.
        self._hand_over_reads = max(200, 2 * engine.caps.run_snapshot_every)

    def _commit(
        self,
        claim: Claim,
        wf: Workflow,
        run: RunState | None,
        decide: Callable[[RunState], Decision],
        *,
        claim_next: Claimant | None = None,
    ) -> Claim | None:
        """Decide from `run` (read if not given), then commit the events and the queue's change under the
        claim's fence, deciding again after reading what changed on a version conflict. `run` is advanced,
        in place, with the events committed. With `claim_next`, the first node made ready is claimed for
        the caller in the same transaction, or, when this end finishes the run, a ready node of another
        run (in the same statement for a run without a key: one transaction less than a claim of its own):
        its claim is returned."""
        if run is None:
            run = self.engine.load(claim.run_id, tenant=claim.tenant)
        for _ in range(END_ATTEMPTS):
            decision = decide(run)
            events = list(decision.events)
            try:
                terminal = any(e.type in _TERMINAL for e in events)
                written: WrittenJson | None = None
                if decision.suspension is None and not (terminal and run.key is not None):
                    successor, outcome, result, written = self._record(
                        claim, wf, run, decision, events, claim_next, terminal
                    )
                else:
                    successor, outcome, result = self._transact(claim, wf, run, decision, events, claim_next)
            except WrongExpectedVersionError:
                self.engine.catch_up(run)
                continue
            ended_paused = run.paused and terminal
            advance(run, events, result, outcome.recorded_at, written)
            if ended_paused:
                self._forget_pause(run)
            if successor is not None and successor.run_id == run.run_id:
                successor = dataclasses.replace(successor, crashes=outcome.successor_crashes)
            return successor
        raise ConflictError(
            f"run {claim.run_id}: too many concurrent changes while ending node {claim.node!r}"
        )

    def _record(
        self,
        claim: Claim,
        wf: Workflow,
        run: RunState,
        decision: Decision,
        events: list[NewEvent],
        claim_next: Claimant | None,
        terminal: bool,
    ) -> tuple[Claim | None, queue_end_rows.NodeEnded, AppendResult, WrittenJson]:
        """The commonest ends, one that leaves its run going and one that finishes a run without a key: the
        queue's change and the events in one statement, so one transaction and one round trip (see
        ledgerflow.wf_record_node_end). The end of a run also claims, in that statement, a ready node of
        another run for `claim_next` (ledgerflow.wf_record_run_end)."""
        next_run = claim_next if terminal and claim_next is not None and claim_next.workflows else None
        ended: queue_end_rows.RunEnded | None = None
        with fenced_writes(), self.store.statement_connection() as conn:
            successor, change = _hand_off(conn, claim, wf, run, decision, events, claim_next)
            began = time.perf_counter()
            append = self.store.one_stream_params(
                ev.run_stream(claim.run_id), events, run.version, claim.tenant
            )
            if next_run is None:
                outcome, rows = queue_node_ends.record_node_end(conn, claim, append, **change)
            else:
                ended = queue_node_ends.record_run_end(
                    conn, claim, append, next_run, read_limit=self._hand_over_reads, **change
                )
                outcome, rows = ended.outcome, ended.appended
        self.store.notify_appended()
        if ended is not None:
            # Its NodeClaimed was appended by the claim itself (see ledgerflow.wf_claim).
            record_appended(self.store, ended.claims, ended.claims_appended, began)
            if ended.claims:
                successor = self._with_run(ended.claims[0], ended.next_run_snapshot, ended.next_run_events)
        written = WrittenJson(append["data"], append["metadata"])
        return successor, outcome, self.store.appended(rows, claim.tenant, began), written

    def _with_run(self, claim: Claim, snapshot: tuple[int, str] | None, rows: list[EventRow]) -> Claim:
        """`claim` with its run's state: its snapshot with the events the claiming statement read after it
        folded in; without it if more events follow the snapshot than that read takes, or the snapshot is
        of a format this code does not read (the worker loads the run when the node starts: nothing here
        may fail once the end has committed)."""
        if len(rows) >= self._hand_over_reads:
            return claim
        run: RunState | None = RunState(claim.run_id, claim.tenant)
        if snapshot is not None:
            run = snapshots.from_json(claim.run_id, claim.tenant, snapshot[1])
        if run is None:
            return claim
        for e in self.store.recorded(rows):
            apply(run, e)
        return dataclasses.replace(claim, loaded=run)

    def _transact(
        self,
        claim: Claim,
        wf: Workflow,
        run: RunState,
        decision: Decision,
        events: list[NewEvent],
        claim_next: Claimant | None,
    ) -> tuple[Claim | None, queue_end_rows.NodeEnded, AppendResult]:
        """Any other end (a suspension, or an end that finishes a run with a key: it also releases the key,
        in a stream of its own, and may claim a node of another run) in a pipelined transaction."""
        with fenced_writes(), self.engine.pipelined_transaction() as conn:
            successor, change = _hand_off(conn, claim, wf, run, decision, events, claim_next)
            if (wait := decision.suspension) is not None:
                ended = _suspended(
                    queue_node_ends.suspend_node(
                        conn, claim, until=wait.until, now=wait.now, signal=wait.signal
                    )
                )
            else:
                ended = queue_node_ends.end_node(conn, claim, **change)
            terminal = any(e.type in _TERMINAL for e in events)
            next_run: Callable[[], tuple[list[Claim], queue_claims.AppendedRows]] | None = None
            if terminal and claim_next is not None and claim_next.workflows:
                next_run = queue_claims.claim_later(
                    conn,
                    worker_name=claim_next.worker_name,
                    instance=claim_next.instance,
                    worker_id=claim_next.worker_id,
                    workflows=claim_next.workflows,
                    limit=1,
                    ttl=claim_next.ttl,
                )
            appends = [StreamAppend(ev.run_stream(claim.run_id), events, run.version)]
            if terminal:
                appends += release_key_appends(run)
            result = self.store.append_many(appends, tenant=claim.tenant, conn=conn)
            outcome = ended()
            if next_run is not None:
                # Its NodeClaimed was appended by the claim itself (see `claim` in queries.sql).
                taken, appended = next_run()
                record_appended(self.store, taken, appended, time.perf_counter())
                if taken:
                    successor = taken[0]
        return successor, outcome, result

    def _forget_pause(self, run: RunState) -> None:
        """A paused run that its last running nodes ended is paused no more: its pause row goes. Best
        effort, after the end committed: a row left behind holds nothing back (the run has no queue rows),
        and a retry or refresh of the run drops it (Engine._reopen)."""
        try:
            with wrap_exceptions(), self.store.pool.connection() as conn:
                queue_run_changes.forget_pause(conn, run.run_id)
        except Exception as exc:
            log.warning("workflow_pause_not_forgotten", run_id=str(run.run_id), error=str(exc))

"""How a claimed node ends: succeeded, failed (with a retry or for good), cancelled, or handed back.

An end records two things: the queue's side (the fence on the claim, the node's row, the newly runnable
nodes, and the successor the worker hands to itself, already claimed) and the run-stream events, at the
exact version the worker knows. An end that leaves its run going does both in one statement, so one
transaction and one round trip (`_record`); so does the end of a run without a key, which also claims a
ready node of another run for the worker (the claim appends that node's NodeClaimed itself) and reads that
run. The end of a run with a key, which also releases the key in a stream of its own, and a suspension are
one pipelined transaction of two round trips (`_transact`).

The decision of what runs next (and whether the run ended) is made from the worker's own copy of the
run's state, kept up to date with the events it appends; if the run changed meanwhile the append fails,
the worker reads only the events it has not seen and decides again, so two sibling nodes finishing at the
same moment cannot both miss (or both start) their common dependent.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import psycopg
import structlog

from eventstore import (
    ANY,
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
from workflows import node_queue, snapshots
from workflows.cancelling import release_key_appends
from workflows.definition import NodeSpec, Workflow
from workflows.engine import Engine, WrittenJson, advance
from workflows.errors import SQLSTATES, ContinueAsNew, NodeSuspended, RunCancelled, wrap_exceptions
from workflows.node_queue import Claim, Claimant
from workflows.quotas import TenantQuotas
from workflows.run_state import RunState, apply
from workflows.scheduler import NodeStatus, run_outcome, runnable_nodes

log = structlog.get_logger(__name__)
_ATTEMPTS = 50
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


def _suspended(recorded_at: Callable[[], datetime]) -> Callable[[], node_queue.NodeEnded]:
    """A suspension's answer in the shape of a node end's: it claims no successor."""
    return lambda: node_queue.NodeEnded(0, recorded_at())


def fence(conn: Any, claim: Claim, *, check_cancel: bool = True) -> None:
    """In `conn`'s transaction: fail with NodeLeaseLost unless `claim` still holds its node (and, with
    `check_cancel`, with RunCancelled if its run is being cancelled)."""
    with wrap_exceptions():
        node_queue.fence(conn, claim.run_id, claim.node, claim.token, check_cancel=check_cancel)


@dataclass(frozen=True)
class _Decision:
    """What a node's end records: the run-stream events, the queue's change, and the nodes made ready."""

    events: list[NewEvent]
    ready: list[str] = dataclasses.field(default_factory=list)
    #: Not None: the node runs again after this many seconds.
    retry_in: float | None = None
    #: Not None: the node does not end but waits (see Lifecycle.suspend).
    suspension: _Suspension | None = None


@dataclass(frozen=True)
class _Suspension:
    until: datetime | None
    #: Wake at once: what the node waits for came while it was deciding to wait.
    now: bool
    signal: str | None


def record_appended(
    store: EventStore, claims: list[Claim], appended: node_queue.AppendedRows, began: float
) -> None:
    """What every append does after it (see `EventStore.appended`), for the NodeClaimed events a claim
    appended itself, per tenant."""
    by_tenant: dict[str, node_queue.AppendedRows] = {}
    for claim, row in zip(claims, appended, strict=True):
        by_tenant.setdefault(claim.tenant, []).append(row)
    for tenant, rows in by_tenant.items():
        store.appended(rows, tenant, began)


class _QueueChange(TypedDict):
    """The queue's side of a node's end, as `node_queue.end_node` and `node_queue.record_node_end` take it."""

    retry_in: float | None
    ready: list[NodeSpec]
    attempts: dict[str, int]
    successor: node_queue.Successor | None


def _hand_off(
    conn: Any,
    claim: Claim,
    wf: Workflow,
    run: RunState,
    decision: _Decision,
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
    return successor, {**change, "successor": node_queue.Successor(claim_next, successor.token)}


class Lifecycle:
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
        decide: Callable[[RunState], _Decision],
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
        for _ in range(_ATTEMPTS):
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
        decision: _Decision,
        events: list[NewEvent],
        claim_next: Claimant | None,
        terminal: bool,
    ) -> tuple[Claim | None, node_queue.NodeEnded, AppendResult, WrittenJson]:
        """The commonest ends, one that leaves its run going and one that finishes a run without a key: the
        queue's change and the events in one statement, so one transaction and one round trip (see
        ledgerflow.wf_record_node_end). The end of a run also claims, in that statement, a ready node of
        another run for `claim_next` (ledgerflow.wf_record_run_end)."""
        next_run = claim_next if terminal and claim_next is not None and claim_next.workflows else None
        ended: node_queue.RunEnded | None = None
        with fenced_writes(), self.store.statement_connection() as conn:
            successor, change = _hand_off(conn, claim, wf, run, decision, events, claim_next)
            began = time.perf_counter()
            append = self.store.one_stream_params(
                ev.run_stream(claim.run_id), events, run.version, claim.tenant
            )
            if next_run is None:
                outcome, rows = node_queue.record_node_end(conn, claim, append, **change)
            else:
                ended = node_queue.record_run_end(
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
        decision: _Decision,
        events: list[NewEvent],
        claim_next: Claimant | None,
    ) -> tuple[Claim | None, node_queue.NodeEnded, AppendResult]:
        """Any other end (a suspension, or an end that finishes a run with a key: it also releases the key,
        in a stream of its own, and may claim a node of another run) in a pipelined transaction."""
        with fenced_writes(), self.engine.pipelined_transaction() as conn:
            successor, change = _hand_off(conn, claim, wf, run, decision, events, claim_next)
            if (wait := decision.suspension) is not None:
                ended = _suspended(
                    node_queue.suspend_node(conn, claim, until=wait.until, now=wait.now, signal=wait.signal)
                )
            else:
                ended = node_queue.end_node(conn, claim, **change)
            terminal = any(e.type in _TERMINAL for e in events)
            next_run: Callable[[], tuple[list[Claim], node_queue.AppendedRows]] | None = None
            if terminal and claim_next is not None and claim_next.workflows:
                next_run = node_queue.claim_later(
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

    def succeeded(
        self,
        claim: Claim,
        wf: Workflow,
        output: Any,
        duration: float,
        *,
        claim_next: Claimant | None = None,
        run: RunState | None = None,
    ) -> Claim | None:
        """Record the node's success and queue what became runnable. With `claim_next`, also claim one of
        those nodes for the caller in the same transaction and return its claim. `run`, the caller's copy
        of the run's state, is advanced with what was recorded."""

        def decide(run: RunState) -> _Decision:
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.SUCCEEDED
            events = [
                new.node_succeeded(
                    run_id=claim.run_id,
                    node=claim.node,
                    attempt=claim.attempt,
                    generation=claim.attempt,
                    output=output,
                    duration_ms=round(duration * 1000, 3),
                )
            ]
            ready = [] if run.cancel_requested else runnable_nodes(wf, statuses)
            for name in ready:
                statuses[name] = NodeStatus.READY
            if ready:
                events.append(new.nodes_ready(run_id=claim.run_id, nodes=ready))
            events += self._run_end(run, wf, statuses)
            return _Decision(events, ready)

        return self._commit(claim, wf, run, decide, claim_next=claim_next)

    def failed(
        self,
        claim: Claim,
        wf: Workflow,
        error: BaseException,
        *,
        rng: random.Random | None = None,
        run: RunState | None = None,
    ) -> bool:
        """Record a failed attempt: schedule a retry if the policy allows, else fail the node. Returns
        True when a retry was scheduled."""
        spec = wf.nodes[claim.node]
        message = f"{type(error).__name__}: {error}"[:2000]
        retrying = False

        def decide(run: RunState) -> _Decision:
            nonlocal retrying
            failures = run.node(claim.node).failures + 1
            retrying = spec.retry.is_retryable(error) and failures < spec.retry.max_attempts
            if retrying and not run.cancel_requested:
                delay = spec.retry.backoff(failures, rng)
                event = new.node_retry_scheduled(
                    run_id=claim.run_id,
                    node=claim.node,
                    attempt=claim.attempt,
                    error=message,
                    retry_in=round(delay, 3),
                )
                return _Decision([event], retry_in=delay)
            retrying = False
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.FAILED
            events = [
                new.node_failed(
                    run_id=claim.run_id,
                    node=claim.node,
                    attempt=claim.attempt,
                    error=message,
                    error_class=type(error).__qualname__,
                )
            ]
            events += self._run_end(run, wf, statuses, failed_node=claim.node, error=message)
            return _Decision(events)

        self._commit(claim, wf, run, decide)
        log.warning(
            "workflow_node_failed",
            run_id=str(claim.run_id),
            node=claim.node,
            attempt=claim.attempt,
            error=message,
            retry=retrying,
        )
        return retrying

    def cancelled(self, claim: Claim, wf: Workflow, *, run: RunState | None = None) -> None:
        """The node stopped at its fence's cancellation flag. The run is being cancelled: the node is
        cancelled. Or the run was paused with its running nodes interrupted (or resumed since): the node is
        handed back, neither a crash nor a failed attempt, to go on from its checkpoints when claimed again,
        which the pause defers until the resume."""
        if run is None:
            run = self.engine.load(claim.run_id, tenant=claim.tenant)
        for _ in range(_ATTEMPTS):
            if run.cancel_requested:
                break
            try:
                self._hand_back(claim, run)
            except WrongExpectedVersionError:
                self.engine.catch_up(run)  # a cancellation or a resume came between: decide again
                continue
            log.info(
                "workflow_node_interrupted", run_id=str(claim.run_id), node=claim.node, paused=run.paused
            )
            return

        def decide(run: RunState) -> _Decision:
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.CANCELLED
            events = [new.node_cancelled(run_id=claim.run_id, node=claim.node)]
            events += self._run_end(run, wf, statuses)
            return _Decision(events)

        self._commit(claim, wf, run, decide)
        log.info("workflow_node_cancelled", run_id=str(claim.run_id), node=claim.node)

    def _forget_pause(self, run: RunState) -> None:
        """A paused run that its last running nodes ended is paused no more: its pause row goes. Best
        effort, after the end committed: a row left behind holds nothing back (the run has no queue rows),
        and a retry or refresh of the run drops it (Engine._reopen)."""
        try:
            with wrap_exceptions(), self.store.pool.connection() as conn:
                node_queue.forget_pause(conn, run.run_id)
        except Exception as exc:
            log.warning("workflow_pause_not_forgotten", run_id=str(run.run_id), error=str(exc))

    def _hand_back(self, claim: Claim, run: RunState) -> None:
        """Hand an interrupted node back (see `node_queue.hand_back`), recorded at the exact version `run`
        knows: a pause, a resume or a cancellation committed meanwhile fails it
        (WrongExpectedVersionError)."""
        released = new.node_released(
            run_id=claim.run_id, node=claim.node, worker=run.node(claim.node).worker, reason="paused"
        )
        with fenced_writes(), self.engine.transaction() as conn:
            if node_queue.hand_back(conn, claim.run_id, claim.node, claim.token):
                self.store.append(
                    ev.run_stream(claim.run_id),
                    [released],
                    expected_version=run.version,
                    tenant=claim.tenant,
                    conn=conn,
                )

    def continued(
        self,
        claim: Claim,
        wf: Workflow,
        signal: ContinueAsNew,
        duration: float,
        *,
        run: RunState | None = None,
    ) -> uuid.UUID:
        """The node continued its run as a new one (`NodeContext.continue_as_new`): in one transaction,
        under the claim's fence, the node succeeds, the run's other queue rows go (their holders' next
        write finds their lease lost, as after Engine.terminate), the run ends as `continued` with its
        successor's id, and the successor starts. All or nothing: a crash before the commit leaves the run
        going and its node to be reclaimed, which calls again and starts the same successor (its id and
        idempotency key derive from the run's); after the commit the claim is gone, so nothing repeats. A
        run being cancelled raises RunCancelled from the fence, having started nothing."""
        if run is None:
            run = self.engine.load(claim.run_id, tenant=claim.tenant)
        for _ in range(_ATTEMPTS):
            if run.cancel_requested:
                raise RunCancelled(f"run {claim.run_id} is being cancelled")
            try:
                with fenced_writes(), self.engine.transaction() as conn:
                    node_queue.lock_run_nodes(conn, claim.run_id, claim.tenant)
                    # The fence names the guarantee: only the claim's holder, of a run not being cancelled,
                    # ends the run and starts its successor.
                    node_queue.fence(conn, claim.run_id, claim.node, claim.token, check_cancel=True)
                    dropped = node_queue.terminate_run(conn, claim.run_id)
                    successor = self.engine.start_successor(conn, run, signal.input, signal.tags)
                    if self.quotas is not None:
                        # Counted, never refused: the run's work goes on, and a tenant that loops through
                        # continuations still starts runs at its quota's rate (workflows.quotas).
                        self.quotas.charge_start(conn, claim.tenant)
                    events = [
                        new.node_cancelled(run_id=claim.run_id, node=n) for n in dropped if n != claim.node
                    ]
                    events += [
                        new.node_succeeded(
                            run_id=claim.run_id,
                            node=claim.node,
                            attempt=claim.attempt,
                            generation=claim.attempt,
                            output=None,
                            duration_ms=round(duration * 1000, 3),
                        ),
                        new.run_continued_as_new(
                            run_id=claim.run_id, successor_run_id=successor, node=claim.node
                        ),
                    ]
                    # At the version this worker knows: a cancellation or a sibling's write committed
                    # meanwhile fails the whole transaction, successor's start included.
                    self.store.append(
                        ev.run_stream(claim.run_id),
                        events,
                        expected_version=run.version,
                        tenant=claim.tenant,
                        conn=conn,
                    )
            except WrongExpectedVersionError as exc:
                if exc.stream_id != ev.run_stream(claim.run_id):
                    raise
                self.engine.catch_up(run)
                continue
            self.store.notify_appended()
            was_paused = run.paused
            self.engine.catch_up(run)
            if was_paused:
                self._forget_pause(run)
            log.info(
                "workflow_run_continued_as_new",
                run_id=str(claim.run_id),
                node=claim.node,
                successor_run_id=str(successor),
            )
            return successor
        raise ConflictError(
            f"run {claim.run_id}: too many concurrent changes while continuing it as a new run"
        )

    def suspend(
        self, claim: Claim, wf: Workflow, wait: NodeSuspended, *, run: RunState | None = None
    ) -> None:
        """The node waits for a timer or a signal: record the wait and make its queue row due when the
        wait ends, so it holds no worker meanwhile. The wait is recorded at the run's exact version: if a
        signal came after the node looked (and found none), the append fails, the node's copy reads it,
        and the node is due at once instead."""

        def decide(run: RunState) -> _Decision:
            arrived = wait.signal is not None and run.untaken_signal(wait.signal) is not None
            event = new.node_waiting(
                run_id=claim.run_id,
                node=claim.node,
                attempt=claim.attempt,
                key=wait.key,
                until=wait.until.isoformat() if wait.until is not None else None,
                signal=wait.signal,
            )
            return _Decision([event], suspension=_Suspension(wait.until, arrived, wait.signal))

        self._commit(claim, wf, run, decide)
        log.info(
            "workflow_node_waiting",
            run_id=str(claim.run_id),
            node=claim.node,
            signal=wait.signal,
            until=wait.until.isoformat() if wait.until is not None else None,
        )

    def release(self, claim: Claim, worker: str) -> None:
        """Hand the node back at once (graceful shutdown): it becomes ready for another worker."""
        with self.engine.transaction() as conn:
            if node_queue.release(conn, claim.run_id, claim.node, claim.token):
                self.store.append(
                    ev.run_stream(claim.run_id),
                    [new.node_released(run_id=claim.run_id, node=claim.node, worker=worker)],
                    expected_version=ANY,
                    tenant=claim.tenant,
                    conn=conn,
                )

    @staticmethod
    def _run_end(
        run: RunState,
        wf: Workflow,
        statuses: dict[str, NodeStatus],
        *,
        failed_node: str | None = None,
        error: str | None = None,
    ) -> list[NewEvent]:
        """The run's closing event, if this transition ends it."""
        in_flight = any(
            s in (NodeStatus.RUNNING, NodeStatus.READY, NodeStatus.RETRY_SCHEDULED, NodeStatus.WAITING)
            for s in statuses.values()
        )
        if run.cancel_requested:
            return [] if in_flight else [new.run_cancelled(run_id=run.run_id)]
        outcome = run_outcome(wf, statuses)
        if outcome == "succeeded":
            return [new.run_completed(run_id=run.run_id)]
        if outcome == "failed" and not in_flight:
            culprit = failed_node or next((n for n, s in statuses.items() if s == NodeStatus.FAILED), None)
            return [
                new.run_failed(run_id=run.run_id, node=culprit, error=error or run.node(culprit or "").error)
            ]
        return []

"""How a claimed node ends: succeeded, failed (with a retry or for good), cancelled, or handed back.

Each transition is one transaction: the fencing check on the claim, the run-stream events with an
exact expected version, and the queue changes. The decision of what runs next (and whether the run
ended) is made from the freshly read run state; on a version conflict it is read and made again, so two
sibling nodes finishing at the same moment cannot both miss starting their common dependent.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import structlog

from eventstore import ANY, NewEvent, StreamAppend, WrongExpectedVersionError
from eventstore.errors import ConflictError
from workflows import events as ev
from workflows import queue
from workflows.definition import Workflow
from workflows.engine import Engine, release_key_appends
from workflows.errors import wrap_exceptions
from workflows.queue import Claim, Claimant
from workflows.scheduler import NodeStatus, run_outcome, runnable_nodes
from workflows.state import RunState

log = structlog.get_logger(__name__)
_ATTEMPTS = 50
#: Queue changes made in a transition's transaction; they may return events to append with it.
QueueChanges = Callable[[Any], list[NewEvent] | None]


def claimed_event(claim: Claim, worker_id: str) -> NewEvent:
    return ev.event(
        ev.NODE_CLAIMED,
        claim.run_id,
        node=claim.node,
        attempt=claim.attempt,
        token=claim.token,
        worker=worker_id,
    )


def fence(conn: Any, claim: Claim, *, check_cancel: bool = True) -> None:
    """In `conn`'s transaction: fail with NodeLeaseLost unless `claim` still holds its node (and, with
    `check_cancel`, with RunCancelled if its run is being cancelled)."""
    with wrap_exceptions():
        queue.fence(conn, claim.run_id, claim.node, claim.token, check_cancel=check_cancel)


class Lifecycle:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.store = engine.store

    def _commit(
        self,
        claim: Claim,
        decide: Callable[[RunState], tuple[list[NewEvent], QueueChanges]],
        *,
        check_cancel: bool = False,
    ) -> RunState:
        """Read the run, decide, and commit events plus queue changes under the claim's fence, retrying the
        whole decision on a version conflict. Queue changes may return events of their own (a claim's)."""
        for _ in range(_ATTEMPTS):
            run = self.engine.load(claim.run_id, tenant=claim.tenant)
            events, queue_changes = decide(run)
            terminal = any(e.type in (ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED) for e in events)
            appends = [StreamAppend(ev.run_stream(claim.run_id), events, run.version)]
            if terminal:
                appends += release_key_appends(run)
            try:
                with self.engine.transaction() as conn:
                    fence(conn, claim, check_cancel=check_cancel)
                    more = queue_changes(conn) or []
                    if more:
                        appends[0] = StreamAppend(appends[0].stream_id, [*events, *more], run.version)
                    self.store.append_many(appends, tenant=claim.tenant, conn=conn)
                return run
            except WrongExpectedVersionError:
                continue
        raise ConflictError(
            f"run {claim.run_id}: too many concurrent changes while ending node {claim.node!r}"
        )

    def succeeded(
        self, claim: Claim, wf: Workflow, output: Any, duration: float, *, claim_next: Claimant | None = None
    ) -> Claim | None:
        """Record the node's success and queue what became runnable. With `claim_next`, also claim one of
        those nodes for the caller in the same transaction and return its claim."""
        successor: Claim | None = None

        def decide(run: RunState) -> tuple[list[NewEvent], QueueChanges]:
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.SUCCEEDED
            events = [
                ev.event(
                    ev.NODE_SUCCEEDED,
                    claim.run_id,
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
                events.append(ev.event(ev.NODES_READY, claim.run_id, nodes=ready))
            events += self._run_end(run, wf, statuses)

            def changes(conn: Any) -> list[NewEvent]:
                nonlocal successor
                queue.finish(conn, claim.run_id, claim.node)
                queue.enqueue(
                    conn,
                    claim.run_id,
                    claim.tenant,
                    wf.name,
                    [wf.nodes[n] for n in ready],
                    attempts={n: run.node(n).attempt for n in ready},
                )
                successor = None
                if claim_next is None or not ready:
                    return []
                successor = queue.claim_node(conn, claim.run_id, ready[0], claim_next)
                if successor is None:
                    return []
                return [claimed_event(successor, claim_next.worker_id)]

            return events, changes

        self._commit(claim, decide)
        return successor

    def failed(
        self, claim: Claim, wf: Workflow, error: BaseException, *, rng: random.Random | None = None
    ) -> bool:
        """Record a failed attempt: schedule a retry if the policy allows, else fail the node. Returns
        True when a retry was scheduled."""
        spec = wf.nodes[claim.node]
        message = f"{type(error).__name__}: {error}"[:2000]
        retrying = False

        def decide(run: RunState) -> tuple[list[NewEvent], QueueChanges]:
            nonlocal retrying
            failures = run.node(claim.node).failures + 1
            retrying = spec.retry.is_retryable(error) and failures < spec.retry.max_attempts
            if retrying and not run.cancel_requested:
                delay = spec.retry.backoff(failures, rng)
                event = ev.event(
                    ev.NODE_RETRY_SCHEDULED,
                    claim.run_id,
                    node=claim.node,
                    attempt=claim.attempt,
                    error=message,
                    retry_in=round(delay, 3),
                )
                return [event], lambda conn: queue.schedule_retry(conn, claim.run_id, claim.node, delay)
            retrying = False
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.FAILED
            events = [
                ev.event(
                    ev.NODE_FAILED,
                    claim.run_id,
                    node=claim.node,
                    attempt=claim.attempt,
                    error=message,
                    error_class=type(error).__qualname__,
                )
            ]
            events += self._run_end(run, wf, statuses, failed_node=claim.node, error=message)
            return events, lambda conn: queue.finish(conn, claim.run_id, claim.node)

        self._commit(claim, decide)
        log.warning(
            "workflow_node_failed",
            run_id=str(claim.run_id),
            node=claim.node,
            attempt=claim.attempt,
            error=message,
            retry=retrying,
        )
        return retrying

    def cancelled(self, claim: Claim, wf: Workflow) -> None:
        def decide(run: RunState) -> tuple[list[NewEvent], QueueChanges]:
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.CANCELLED
            events = [ev.event(ev.NODE_CANCELLED, claim.run_id, node=claim.node)]
            events += self._run_end(run, wf, statuses)
            return events, lambda conn: queue.finish(conn, claim.run_id, claim.node)

        self._commit(claim, decide)
        log.info("workflow_node_cancelled", run_id=str(claim.run_id), node=claim.node)

    def release(self, claim: Claim, worker: str) -> None:
        """Hand the node back at once (graceful shutdown): it becomes ready for another worker."""
        with self.engine.transaction() as conn:
            if queue.release(conn, claim.run_id, claim.node, claim.token):
                self.store.append(
                    ev.run_stream(claim.run_id),
                    [ev.event(ev.NODE_RELEASED, claim.run_id, node=claim.node, worker=worker)],
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
            s in (NodeStatus.RUNNING, NodeStatus.READY, NodeStatus.RETRY_SCHEDULED) for s in statuses.values()
        )
        if run.cancel_requested:
            return [] if in_flight else [ev.event(ev.RUN_CANCELLED, run.run_id)]
        outcome = run_outcome(wf, statuses)
        if outcome == "succeeded":
            return [ev.event(ev.RUN_COMPLETED, run.run_id)]
        if outcome == "failed" and not in_flight:
            culprit = failed_node or next((n for n, s in statuses.items() if s == NodeStatus.FAILED), None)
            return [
                ev.event(
                    ev.RUN_FAILED, run.run_id, node=culprit, error=error or run.node(culprit or "").error
                )
            ]
        return []

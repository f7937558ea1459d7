"""How a claimed node ends: succeeded, failed (with a retry or for good), cancelled, or handed back.

An end records the queue's side and the run-stream events together (how: `workflows.node_end_writes`).

The decision of what runs next (and whether the run ended) is made from the worker's own copy of the
run's state, kept up to date with the events it appends; if the run changed meanwhile the append fails,
the worker reads only the events it has not seen and decides again, so two sibling nodes finishing at the
same moment cannot both miss (or both start) their common dependent.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import structlog

from eventstore import ANY, ConflictError, NewEvent, WrongExpectedVersionError
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_node_ends, queue_run_changes
from workflows.definition import Workflow
from workflows.errors import ContinueAsNew, NodeSuspended, RunCancelled
from workflows.node_end_writes import END_ATTEMPTS, Decision, NodeEndWriter, Suspension, fenced_writes
from workflows.queue_claims import Claim, Claimant
from workflows.run_state import RunState
from workflows.scheduler import NodeStatus, run_outcome, runnable_nodes

log = structlog.get_logger(__name__)


class Lifecycle(NodeEndWriter):
    """What a node's end records, decided from the run's state, for each way a node ends."""

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

        def decide(run: RunState) -> Decision:
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
            return Decision(events, ready)

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

        def decide(run: RunState) -> Decision:
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
                return Decision([event], retry_in=delay)
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
            return Decision(events)

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
        for _ in range(END_ATTEMPTS):
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

        def decide(run: RunState) -> Decision:
            statuses = run.statuses
            statuses[claim.node] = NodeStatus.CANCELLED
            events = [new.node_cancelled(run_id=claim.run_id, node=claim.node)]
            events += self._run_end(run, wf, statuses)
            return Decision(events)

        self._commit(claim, wf, run, decide)
        log.info("workflow_node_cancelled", run_id=str(claim.run_id), node=claim.node)

    def _hand_back(self, claim: Claim, run: RunState) -> None:
        """Hand an interrupted node back (see `queue_run_changes.hand_back`), recorded at the exact version
        `run` knows: a pause, a resume or a cancellation committed meanwhile fails it
        (WrongExpectedVersionError)."""
        released = new.node_released(
            run_id=claim.run_id, node=claim.node, worker=run.node(claim.node).worker, reason="paused"
        )
        with fenced_writes(), self.engine.transaction() as conn:
            if queue_run_changes.hand_back(conn, claim.run_id, claim.node, claim.token):
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
        for _ in range(END_ATTEMPTS):
            if run.cancel_requested:
                raise RunCancelled(f"run {claim.run_id} is being cancelled")
            try:
                with fenced_writes(), self.engine.transaction() as conn:
                    queue_run_changes.lock_run_nodes(conn, claim.run_id, claim.tenant)
                    # The fence names the guarantee: only the claim's holder, of a run not being cancelled,
                    # ends the run and starts its successor.
                    queue_node_ends.fence(conn, claim.run_id, claim.node, claim.token, check_cancel=True)
                    dropped = queue_run_changes.terminate_run(conn, claim.run_id)
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

        def decide(run: RunState) -> Decision:
            arrived = wait.signal is not None and run.untaken_signal(wait.signal) is not None
            event = new.node_waiting(
                run_id=claim.run_id,
                node=claim.node,
                attempt=claim.attempt,
                key=wait.key,
                until=wait.until.isoformat() if wait.until is not None else None,
                signal=wait.signal,
            )
            return Decision([event], suspension=Suspension(wait.until, arrived, wait.signal))

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
            if queue_run_changes.release(conn, claim.run_id, claim.node, claim.token):
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

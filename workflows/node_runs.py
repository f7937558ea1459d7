"""Running claimed nodes: each in a thread of the worker's pool, or, an `async def` one, on its event loop;
everything around a node's body (its context, the recording of its end, an outage under it, a lost lease,
a stop), and going on with the successor a node's end claimed for this worker."""

from __future__ import annotations

import time
from collections.abc import Generator

import structlog
from opentelemetry import trace

from eventstore import NotFoundError
from eventstore.spi import is_unavailable, span_if_traced
from workflows import metrics
from workflows.aio import Body, StartedTogether, is_async, run_in_thread
from workflows.context import NodeContext
from workflows.errors import ContinueAsNew, NodeLeaseLost, NodeSuspended, RunCancelled, WorkerStopping
from workflows.node_spec import NodeSpec
from workflows.queue_claims import Claim
from workflows.run_state import RunState
from workflows.worker_state import DatabaseGone, WorkerState

log = structlog.get_logger(__name__)
_tracer = trace.get_tracer("ledgerflow.workflows")


class NodeRuns(WorkerState):
    def _track(self, claim: Claim) -> bool:
        """Count a claimed node as running (heartbeats cover it from now on), in a thread or on the event
        loop; True if it is an `async def` node, for the loop. A node this worker does not know goes to a
        thread, and fails there as it always did."""
        try:
            spec = self.registry.get(claim.workflow, claim.version).nodes.get(claim.node)
        except NotFoundError:
            spec = None
        on_loop = spec is not None and is_async(spec.fn)
        with self._lock:
            self._running[claim.token] = (claim, None)
            if on_loop:
                self._on_loop.add(claim.token)
        return on_loop

    def _start(self, claim: Claim, run: RunState | None, together: StartedTogether | None = None) -> None:
        """Run a claimed node: an `async def` one on the event loop, any other in a thread of the pool.
        `together`: the nodes started with it, whose ends wait until all their bodies were entered (an
        `async def` body never waits: it counts as entered at once)."""
        if self._track(claim):
            if together is not None:
                together.entered()
            self._loop.submit(lambda: self._execute_async(claim, run))
        else:
            self._pool.submit(self._execute, claim, run, together)

    def _execute(
        self, claim: Claim, run: RunState | None = None, together: StartedTogether | None = None
    ) -> None:
        """Run the claimed node, then, as long as finishing one hands this worker another (its successor,
        or, when it finished the run, a ready node of another run), that one. A run's state is read once,
        when the worker starts on it: each end advances it with the events it recorded."""
        next_claim: Claim | None = claim
        while next_claim is not None:
            next_claim, run = run_in_thread(self._node_steps(next_claim, run), together=together)
            together = None  # the nodes it goes on with were not started with the others
            if next_claim is not None and self._track(next_claim):
                self._start(next_claim, run)  # to the event loop; this thread is free
                return

    async def _execute_async(self, claim: Claim, run: RunState | None = None) -> None:
        """`_execute` for `async def` nodes, on the event loop."""
        next_claim: Claim | None = claim
        while next_claim is not None:
            next_claim, run = await self._loop.run(self._node_steps(next_claim, run))
            if next_claim is not None and not self._track(next_claim):
                self._start(next_claim, run)  # to a thread of the pool
                return

    def _node_steps(
        self, claim: Claim, loaded: RunState | None = None
    ) -> Generator[Body, object, tuple[Claim | None, RunState | None]]:
        """Everything around one node's body, which it yields to its driver (workflows/aio.py) and gets
        back as the body's output or exception. Returns the successor this worker claimed at its end,
        with the run's state."""
        successor: Claim | None = None
        run = loaded
        bound = structlog.contextvars.bound_contextvars(
            run_id=str(claim.run_id), node=claim.node, attempt=claim.attempt, worker=self.id
        )
        started = time.monotonic()
        outcome = "succeeded"
        span = span_if_traced(
            _tracer,
            "ledgerflow.node",
            lambda: {
                "ledgerflow.run_id": str(claim.run_id),
                "ledgerflow.node": claim.node,
                "ledgerflow.workflow": claim.workflow,
                "ledgerflow.attempt": claim.attempt,
            },
        )
        with bound, span as current:
            try:
                wf = self.registry.get(claim.workflow, claim.version)
                if claim.cancel_requested:
                    outcome = "cancelled"
                    self._mark_ending(claim)
                    self._through_outage(lambda: self.lifecycle.cancelled(claim, wf, run=run))
                    return None, None
                if run is None:
                    run = self._through_outage(lambda: self.engine.load(claim.run_id, tenant=claim.tenant))
                held = run
                spec = wf.nodes[claim.node]
                ctx = NodeContext(self.engine, held, claim, spec, worker=self.id, stopping=self.stopping)
                with self._lock:
                    self._running[claim.token] = (claim, ctx)
                try:
                    output = yield Body(spec.fn, ctx, claim.token)
                    ctx.check()
                    # An output that cannot be recorded is the node's failure, not the worker's crash. A
                    # None output is no output: the state holds nothing for it (workflows.run_state).
                    in_state = held.held_bytes if output is not None else 0
                    self.engine.caps.check_output(f"output of node {claim.node!r}", output, in_state)
                except (NodeLeaseLost, RunCancelled, WorkerStopping):
                    raise
                except NodeSuspended as suspended:
                    # The node waits for a timer or a signal: its row becomes due when the wait ends, and
                    # this thread is free for other nodes meanwhile.
                    outcome = "waiting"
                    self._mark_ending(claim)
                    wait = suspended
                    self._through_outage(lambda: self.lifecycle.suspend(claim, wf, wait, run=held))
                    return None, None
                except ContinueAsNew as continuing:
                    # The run ends and its successor starts, together (see Lifecycle.continued).
                    outcome = "continued"
                    self._mark_ending(claim)
                    signal, took = continuing, time.monotonic() - started
                    self._through_outage(lambda: self.lifecycle.continued(claim, wf, signal, took, run=held))
                    self._interrupts.progressed()
                    return None, None
                except Exception as exc:
                    if is_unavailable(exc):
                        outcome = self._interrupted(claim, exc)
                        return None, None
                    self._mark_ending(claim)
                    try:
                        outcome = "retry" if self.lifecycle.failed(claim, wf, exc, run=held) else "failed"
                    except Exception as recording:
                        if not is_unavailable(recording):
                            raise
                        # The failure cannot be recorded: most likely the outage made the node fail.
                        outcome = self._interrupted(claim, recording)
                        return None, None
                    self._interrupts.progressed()
                    if outcome == "retry":
                        metrics.node_retries.add(1, {"workflow": wf.name, "node": claim.node})
                    return None, None
                duration = time.monotonic() - started
                self._mark_ending(claim)
                successor = self._through_outage(
                    lambda: self.lifecycle.succeeded(
                        claim,
                        wf,
                        output,
                        duration,
                        claim_next=self._claimant if self._may_take_successor(spec) else None,
                        run=held,
                    )
                )
                self._interrupts.progressed()
                if successor is not None:
                    self._track(successor)
                    metrics.nodes_claimed.add(1)
            except NodeLeaseLost:
                outcome = "lease_lost"
                log.warning("workflow_node_lease_lost")
            except RunCancelled:
                outcome = "cancelled"
                self._mark_ending(claim)
                # The run's copy may be behind by what the node wrote: the end reads what it misses.
                wf_then = self.registry.get(claim.workflow, claim.version)
                self._through_outage(lambda: self.lifecycle.cancelled(claim, wf_then, run=run))
            except WorkerStopping:
                outcome = "released"
                try:
                    self.lifecycle.release(claim, self.id)
                    log.info("workflow_node_released")
                except Exception as exc:
                    if not is_unavailable(exc):
                        raise
                    self.outage.failed(exc)  # the lease lapses and recovery takes it back
            except DatabaseGone:
                outcome = "database_unavailable"  # the lease lapses and recovery takes it back
            except Exception as exc:
                outcome = "error"
                if is_unavailable(exc):
                    self.outage.failed(exc)  # the lease lapses and recovery takes it back
                else:
                    log.exception("workflow_node_crashed")  # the lease lapses and recovery takes it back
            finally:
                with self._lock:
                    self._running.pop(claim.token, None)
                    self._ending.discard(claim.token)
                    self._on_loop.discard(claim.token)
                elapsed_ms = (time.monotonic() - started) * 1000
                current.set_attribute("ledgerflow.outcome", outcome)
                metrics.nodes_finished.add(1, {"outcome": outcome})
                metrics.node_duration.record(elapsed_ms, {"workflow": claim.workflow, "node": claim.node})
                if successor is None:
                    self._wake.set()  # a slot is free, and other nodes may be ready now
        if successor is not None and run is not None and successor.run_id != run.run_id:
            # Another run: read by the statement that claimed it, else when its node starts.
            return successor, successor.loaded
        return successor, run

    def _may_take_successor(self, spec: NodeSpec) -> bool:
        """Whether a node's end may claim the next node for this worker: not when it stops, nor when the
        next node could be of the other kind (sync or `async def`) and that kind has no room."""
        if self.stopping.is_set():
            return False
        with self._lock:
            on_loop = len(self._on_loop)
            in_threads = len(self._running) - on_loop
        if is_async(spec.fn):
            return in_threads < self.settings.concurrency or not self._kinds.threaded
        return on_loop < self.settings.async_concurrency or not self._kinds.any_async

    def _mark_ending(self, claim: Claim) -> None:
        with self._lock:
            self._ending.add(claim.token)

    def _interrupted(self, claim: Claim, exc: BaseException) -> str:
        """The database went away under a running node: once it answers, hand the node back so it runs
        again (in this worker or another), without counting a failed attempt. Its memoized steps and
        checkpoints are kept."""
        self.outage.failed(exc)
        self._through_outage(lambda: self.lifecycle.release(claim, self.id))
        log.info("workflow_node_interrupted", error=str(exc))
        self._interrupts.interrupted(exc)
        return "interrupted"

"""The core of a node's context (`workflows.context.NodeContext`): who the node is, the checks every call
makes (shutdown, the node's timeout), its writes under the claim's fencing token, its progress and the
check for cancellation. The calls a node body makes build on these (`workflows.node_waits`,
`workflows.context`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from eventstore import ANY, ExpectedVersion, NewEvent
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_node_ends
from workflows.engine import Engine
from workflows.errors import NodeTimeout, WorkerStopping
from workflows.node_end_writes import fenced_writes
from workflows.node_spec import NodeSpec
from workflows.queue_claims import Claim
from workflows.run_advance import advance
from workflows.run_state import NodeState, RunState

_PROGRESS_EVERY = 0.25  # seconds between progress events, unless the node finishes a stage
#: Writes at the version the node knows that lost to a sibling's meanwhile (a signal taken by a sibling
#: wait, tags set by a sibling): how often to look again.
TAKE_ATTEMPTS = 50


class NodeContextBase:
    """Who the node is, and what every call of its context rests on: the checks and the fenced write."""

    def __init__(
        self,
        engine: Engine,
        run: RunState,
        claim: Claim,
        spec: NodeSpec,
        *,
        worker: str,
        stopping: threading.Event,
    ) -> None:
        self._engine = engine
        self._claim = claim
        self._spec = spec
        self._stopping = stopping
        self._started = time.monotonic()
        #: The worker's copy of the run's state: this node's writes advance it when nothing came between.
        self._run = run
        self._state: NodeState = run.node(claim.node)
        self._last_progress = 0.0
        self.worker = worker
        self.run_id: uuid.UUID = claim.run_id
        self.tenant = claim.tenant
        self.workflow = run.workflow
        self.node = claim.node
        self.attempt = claim.attempt
        #: Outputs are kept per attempt: this attempt's output becomes current only when it succeeds.
        self.generation = claim.attempt
        self.input: Any = run.input
        self.config = dict(spec.config)
        self.outputs: dict[str, Any] = {d: run.node(d).output for d in spec.depends_on}
        self.last_progress_at = time.monotonic()
        #: Waits made so far by this run of the body, per kind: the next one's key is its place in line.
        self._waits: Counter[str] = Counter()
        #: Step keys asked for so far by this run of the body: a key asked for twice is a mistake.
        self._step_keys: set[str] = set()

    # -- checks ---------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise if the node must stop: the worker is shutting down or the attempt ran out of time.
        (Cancellation and a lost lease are found by the next write.)"""
        if self._stopping.is_set():
            raise WorkerStopping(f"worker {self.worker} is stopping")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise self.timed_out()

    @property
    def deadline(self) -> float | None:
        """When (`time.monotonic()`) this attempt runs out of time, if the node has a timeout."""
        timeout = self._spec.timeout
        return None if timeout is None else self._started + timeout

    def timed_out(self) -> NodeTimeout:
        """The error of an attempt that ran past its timeout."""
        return NodeTimeout(f"node {self.node!r} exceeded its timeout of {self._spec.timeout:g}s")

    def _write(self, events: Sequence[NewEvent], expected_version: ExpectedVersion = ANY) -> None:
        """Append under the claim's fence: one transaction, two round trips."""
        self.check()
        claim = self._claim
        with fenced_writes(), self._engine.pipelined_transaction() as conn:
            recorded_at = queue_node_ends.fence_at(conn, claim.run_id, claim.node, claim.token)
            result = self._engine.store.append(
                ev.run_stream(claim.run_id),
                events,
                expected_version=expected_version,
                tenant=claim.tenant,
                conn=conn,
            )
            at = recorded_at()
        advance(self._run, events, result, at)
        self.last_progress_at = time.monotonic()

    # -- progress -------------------------------------------------------------------------------------

    def progress(self, current: int, total: int | None = None, message: str = "") -> None:
        """Report progress. Written at most every 0.25 s (and always when current reaches total)."""
        now = time.monotonic()
        self.last_progress_at = now
        if now - self._last_progress < _PROGRESS_EVERY and current != total:
            self.check()
            return
        self._last_progress = now
        self._write(
            [
                new.node_progress(
                    run_id=self.run_id, node=self.node, current=current, total=total, message=message[:500]
                )
            ]
        )

    def cancelled(self) -> None:
        """Raise RunCancelled now if the run was cancelled (for nodes with long stretches between writes)."""
        claim = self._claim
        # One statement, on its own: it only reads the claim's row (and touches its progress time).
        with fenced_writes(), self._engine.store.pool.connection() as conn:
            queue_node_ends.fence(conn, claim.run_id, claim.node, claim.token)

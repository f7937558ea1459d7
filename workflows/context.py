"""What a node function gets: its input, its dependencies' outputs, and the calls that make it
survive crashes without paying twice.

- `progress(current, total, message)`: live progress (throttled, so it does not flood the log);
- `checkpoint(item, output)` / `map(items, fn)`: per-item results recorded with their checkpoint, so a
  resumed node continues at the first unfinished item;
- `step(key, fn)`: a memoized step; its result is recorded in the log and returned without calling `fn`
  again on retry or resume (the expensive call is paid once);
- `start_workflow(...)`: starts another workflow exactly once, however often the node is retried.

Every write carries the claim's fencing token: once the claim is lost, writes raise NodeLeaseLost.
Every call also checks for cancellation, shutdown and the node's timeout.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from eventstore import ANY, NewEvent
from eventstore._validation import dump_json_object
from workflows import events as ev
from workflows import queue
from workflows.definition import NodeSpec
from workflows.engine import Engine, advance
from workflows.errors import NodeTimeout, RunCancelled, WorkerStopping
from workflows.lifecycle import fenced_writes
from workflows.queue import Claim
from workflows.state import NodeState, RunState

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the item type
_PROGRESS_EVERY = 0.25  # seconds between progress events, unless the node finishes a stage


class NodeContext:
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

    # -- checks ---------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise if the node must stop: the worker is shutting down or the attempt ran out of time.
        (Cancellation and a lost lease are found by the next write.)"""
        if self._stopping.is_set():
            raise WorkerStopping(f"worker {self.worker} is stopping")
        timeout = self._spec.timeout
        if timeout is not None and time.monotonic() - self._started > timeout:
            raise NodeTimeout(f"node {self.node!r} exceeded its timeout of {timeout:g}s")

    def _write(self, events: Sequence[NewEvent]) -> None:
        """Append under the claim's fence: one transaction, two round trips."""
        self.check()
        claim = self._claim
        with fenced_writes(), self._engine.pipelined_transaction() as conn:
            recorded_at = queue.fence_at(conn, claim.run_id, claim.node, claim.token)
            result = self._engine.store.append(
                ev.run_stream(claim.run_id), events, expected_version=ANY, tenant=claim.tenant, conn=conn
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
                ev.event(
                    ev.NODE_PROGRESS,
                    self.run_id,
                    node=self.node,
                    current=current,
                    total=total,
                    message=message[:500],
                )
            ]
        )

    # -- checkpoints ----------------------------------------------------------------------------------

    def checkpointed(self, item: str) -> tuple[bool, Any]:
        """(True, output) if `item` was finished by this or an earlier attempt of the node."""
        if item in self._state.checkpoints:
            return True, self._state.checkpoints[item]
        return False, None

    def checkpoint(self, item: str, output: Any = None) -> None:
        """Record an item's output and its checkpoint together, in one event."""
        dump_json_object({"output": output}, f"checkpoint output of {item!r}")
        self._write(
            [
                ev.event(
                    ev.NODE_CHECKPOINT,
                    self.run_id,
                    node=self.node,
                    attempt=self.attempt,
                    item=item,
                    output=output,
                )
            ]
        )
        self._state.checkpoints[item] = output

    def map(
        self,
        items: Iterable[I],
        fn: Callable[[I], T],
        *,
        key: Callable[[I], str] = str,
        message: Callable[[I], str] | None = None,
    ) -> list[Any]:
        """Apply `fn` to every item not yet checkpointed, checkpointing each result; return all results in
        order. A resumed node skips the finished items: item 26 of 38 resumes at 26, not at 0."""
        listed = list(items)
        results: list[Any] = []
        for index, item in enumerate(listed, start=1):
            done, output = self.checkpointed(key(item))
            if not done:
                output = fn(item)
                self.checkpoint(key(item), output)
            results.append(output)
            self.progress(index, len(listed), message(item) if message else f"{index}/{len(listed)}")
        return results

    @property
    def checkpoints(self) -> dict[str, Any]:
        return dict(self._state.checkpoints)

    # -- memoized steps -------------------------------------------------------------------------------

    def step(self, key: str, fn: Callable[[], T]) -> T:
        """`fn()`'s result, computed once: recorded in the log and returned from there on retry/resume."""
        if key in self._state.steps:
            self.check()
            return self._state.steps[key]  # type: ignore[no-any-return]
        result = fn()
        dump_json_object({"result": result}, f"result of step {key!r}")
        self._write(
            [
                ev.event(
                    ev.STEP_RECORDED,
                    self.run_id,
                    node=self.node,
                    attempt=self.attempt,
                    key=key,
                    result=result,
                )
            ]
        )
        self._state.steps[key] = result
        return result

    # -- child workflows ------------------------------------------------------------------------------

    def start_workflow(
        self, workflow: str, *, input: Any = None, key: str | None = None, child_key: str = "default"
    ) -> uuid.UUID:
        """Start another workflow exactly once for this node, however often the node is retried."""
        if child_key in self._state.children:
            return uuid.UUID(self._state.children[child_key])
        self.check()
        # The same key on every retry: the store returns the first start instead of starting again.
        idempotency_key = (
            "child:" + hashlib.sha256(f"{self.run_id}:{self.node}:{child_key}".encode()).hexdigest()
        )
        started = self._engine.start(
            workflow, input=input, key=key, idempotency_key=idempotency_key, tenant=self.tenant
        )
        self._write(
            [
                ev.event(
                    ev.CHILD_STARTED,
                    self.run_id,
                    node=self.node,
                    key=child_key,
                    child_run_id=str(started.run_id),
                    workflow=workflow,
                )
            ]
        )
        self._state.children[child_key] = str(started.run_id)
        return started.run_id

    def cancelled(self) -> None:
        """Raise RunCancelled now if the run was cancelled (for nodes with long stretches between writes)."""
        claim = self._claim
        # One statement, on its own: it only reads the claim's row (and touches its progress time).
        with fenced_writes(), self._engine.store.pool.connection() as conn:
            queue.fence(conn, claim.run_id, claim.node, claim.token)


__all__ = ["NodeContext", "RunCancelled"]

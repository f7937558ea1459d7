"""What a node function gets: its input, its dependencies' outputs, and the calls that make it
survive crashes without paying twice.

- `progress(current, total, message)`: live progress (throttled, so it does not flood the log);
- `checkpoint(item, output)` / `map(items, fn)`: per-item results recorded with their checkpoint, so a
  resumed node continues at the first unfinished item;
- `step(key, fn)`: a memoized step; its result is recorded in the log and returned without calling `fn`
  again on retry or resume (the expensive call is paid once);
- `start_workflow(...)`: starts another workflow exactly once, however often the node is retried;
- `continue_as_new(input)`: ends the run and starts its successor with `input`, in one transaction;
- `sleep(seconds)` / `sleep_until(when)`: a durable timer;
- `wait_for_signal(name, timeout=...)`: the payload of a signal sent to the run (`Engine.signal`).

A node that waits holds no worker thread and no connection: the wait is recorded, the node's queue row
becomes due when the wait ends, and the worker lets go of it. When it wakes (on any worker, also after
every worker restarted), its body runs again from the start, exactly as after a crash: steps,
checkpoints and ended waits are answered from the log, so the body gets back to where it waited. Waits
are told apart by the order in which the body makes them (the second `sleep` of a body is its second
wait, whatever happened in between), unless given a `key`.

Every write carries the claim's fencing token: once the claim is lost, writes raise NodeLeaseLost.
Every call also checks for cancellation, shutdown and the node's timeout.

An `async def` node gets an `AsyncNodeContext` (workflows/async_context.py) whose calls, awaited, are
these very ones made in a thread; `memoized` and `record_step` are the two halves of `step` it needs,
since its `fn` is awaited on the event loop in between.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

from eventstore import (
    ANY,
    ConflictError,
    ExpectedVersion,
    InvalidInputError,
    NewEvent,
    WrongExpectedVersionError,
)
from workflows import event_models as em
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_node_ends
from workflows.engine import Engine
from workflows.errors import (
    ContinueAsNew,
    NodeSuspended,
    NodeTimeout,
    RepeatedStepKeyError,
    RunCancelled,
    SignalTimeout,
    WorkerStopping,
)
from workflows.limits import step_slots
from workflows.node_end_writes import fenced_writes
from workflows.node_spec import NodeSpec
from workflows.queue_claims import Claim
from workflows.run_advance import advance
from workflows.run_starts import fingerprint
from workflows.run_state import NodeState, RunState

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the item type
_PROGRESS_EVERY = 0.25  # seconds between progress events, unless the node finishes a stage
_TAKE_ATTEMPTS = 50  # a signal taken by a sibling wait meanwhile: look again


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

    # -- checkpoints ----------------------------------------------------------------------------------

    def checkpointed(self, item: str) -> tuple[bool, Any]:
        """(True, output) if `item` was finished by this or an earlier attempt of the node."""
        if item in self._state.checkpoints:
            return True, self._state.checkpoints[item]
        return False, None

    def checkpoint(self, item: str, output: Any = None) -> None:
        """Record an item's output and its checkpoint together, in one event."""
        self._engine.caps.check_output(f"checkpoint output of {item!r}", output, self._run.held_bytes)
        self._write(
            [
                new.node_checkpoint(
                    run_id=self.run_id, node=self.node, attempt=self.attempt, item=item, output=output
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

    def step(self, key: str, fn: Callable[[], T], *, limits: Sequence[str] = ()) -> T:
        """`fn()`'s result, computed once: recorded in the log and returned from there on retry/resume.
        With `limits`, `fn` runs only with a slot of each of those registry limits, held until its result
        is recorded; while one is full the node suspends itself and asks again when it wakes."""
        done, recorded = self.memoized(key)
        if done:
            return recorded  # type: ignore[no-any-return]
        with step_slots(self, key, limits):
            result = fn()
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()  # never awaited, on purpose: nothing of it ran
                raise InvalidInputError(
                    f"step {key!r} got an awaitable: declare the node with `async def` and "
                    "`await ctx.step(...)`"
                )
            self.record_step(key, result)
        return result

    def memoized(self, key: str) -> tuple[bool, Any]:
        """(True, result) if step `key` was recorded by this or an earlier attempt of the node.
        Each key may be asked for once per run of the body (RepeatedStepKeyError otherwise)."""
        if key in self._step_keys:
            raise RepeatedStepKeyError(self.node, key)
        self._step_keys.add(key)
        if key in self._state.steps:
            self.check()
            return True, self._state.steps[key]
        return False, None

    def record_step(self, key: str, result: Any) -> None:
        """Record step `key`'s result (its fn ran), fenced: from now on it is answered from the log."""
        self._engine.caps.check_output(f"result of step {key!r}", result, self._run.held_bytes)
        self._write(
            [
                new.step_recorded(
                    run_id=self.run_id, node=self.node, attempt=self.attempt, key=key, result=result
                )
            ]
        )
        self._state.steps[key] = result

    # -- child workflows ------------------------------------------------------------------------------

    def start_workflow(
        self,
        workflow: str,
        *,
        input: Any = None,
        key: str | None = None,
        child_key: str = "default",
        parent_close: em.ParentClose = "cancel",
    ) -> uuid.UUID:
        """Start another workflow exactly once for this node, however often the node is retried. When this
        run is cancelled, fails or is paused, the child is too (`parent_close="cancel"`), at once, without
        letting its running nodes finish (`"terminate"`), or left alone (`"abandon"`): see
        workflows.children."""
        if parent_close not in em.PARENT_CLOSE_POLICIES:
            raise InvalidInputError(
                f"parent_close must be one of {', '.join(em.PARENT_CLOSE_POLICIES)}, got {parent_close!r}"
            )
        if child_key in self._state.children:
            return uuid.UUID(self._state.children[child_key])
        self.check()
        parent = em.ParentLink(run_id=str(self.run_id), node=self.node, parent_close=parent_close)
        # The same key on every retry: the store returns the first start instead of starting again.
        idempotency_key = (
            "child:" + hashlib.sha256(f"{self.run_id}:{self.node}:{child_key}".encode()).hexdigest()
        )
        started = self._engine.start(
            workflow, input=input, key=key, idempotency_key=idempotency_key, tenant=self.tenant, parent=parent
        )
        self._write(
            [
                new.child_started(
                    run_id=self.run_id,
                    node=self.node,
                    key=child_key,
                    child_run_id=started.run_id,
                    workflow=workflow,
                    parent_close=parent_close,
                )
            ]
        )
        self._state.children[child_key] = str(started.run_id)
        return started.run_id

    # -- continuing as a new run -----------------------------------------------------------------------

    def continue_as_new(self, input: Any = None, *, tags: Mapping[str, str] | None = None) -> NoReturn:
        """End this run and start its successor (same workflow, tenant, key and tags, unless `tags` is
        given; this `input`), atomically: the node's success, the run's end (status `continued`) and the
        successor's start commit together, and however often the node is retried, exactly one successor
        starts (`Lifecycle.continued`). Does not return: the body stops here. The run's other running
        nodes stop as after a terminate. Bad input or tags raise a typed error, having written nothing."""
        self._engine.caps.check_input(input)
        fingerprint(input)  # input that is not JSON fails here, not in the worker
        checked = None
        if tags is not None:
            checked = {k: v for k, v in self._engine.tag_limits.check(dict(tags)).items() if v is not None}
        self.check()
        raise ContinueAsNew(input, checked)

    # -- tags ---------------------------------------------------------------------------------------

    def set_tags(self, tags: Mapping[str, str | None]) -> None:
        """Set tags on the run, to find it by (`workflows.search_runs`): each key gets its value, a None
        value removes the key. Recorded as one event of the run (RunTagged); bounded like a start's tags
        (TagLimitError, nothing written). Setting what the run already carries writes nothing."""
        limits = self._engine.tag_limits
        change = limits.check(tags, removals=True)
        for _ in range(_TAKE_ATTEMPTS):
            current = self._run.tags
            if all(current.get(k) == v for k, v in change.items()):
                self.check()
                return
            limits.merged(current, change)
            tagged = new.run_tagged(run_id=self.run_id, tags=change, node=self.node)
            try:
                # At the version this node knows, so that the count is checked against the run's tags
                # as they are: a sibling node's tags written meanwhile are read and counted first.
                self._write([tagged], expected_version=self._run.version)
                return
            except WrongExpectedVersionError:
                self._engine.catch_up(self._run)
        raise ConflictError(f"run {self.run_id}: the run changed too often while setting tags")

    # -- waiting ------------------------------------------------------------------------------------

    def _wait_key(self, kind: str, key: str | None) -> str:
        self._waits[kind] += 1
        return key if key is not None else f"{kind}#{self._waits[kind]}"

    def sleep(self, seconds: float, *, key: str | None = None) -> None:
        """Wait `seconds`, durably: the node lets go of its worker and wakes within about a second of the
        due time, on any worker. The due time is fixed when the body first reaches this call."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise InvalidInputError(f"sleep takes a finite number of seconds, got {seconds!r}")
        self._wait_until(self._wait_key("sleep", key), lambda: _now() + timedelta(seconds=max(seconds, 0)))

    def sleep_until(self, when: datetime, *, key: str | None = None) -> None:
        """Wait, durably, until `when` (a datetime with a time zone)."""
        if not isinstance(when, datetime) or when.utcoffset() is None:
            raise InvalidInputError(f"sleep_until takes a datetime with a time zone, got {when!r}")
        self._wait_until(self._wait_key("sleep", key), lambda: when)

    def _wait_until(self, key: str, due: Callable[[], datetime]) -> None:
        self.check()
        until = self._state.waits.get(key) or due()
        if _now() < until:
            raise NodeSuspended(key, until)

    def wait_for_signal(self, name: str, *, timeout: float | None = None, key: str | None = None) -> Any:
        """The payload of a signal `name` sent to the run, waiting durably for it if none is there yet.
        Each signal is taken by one wait: the earliest one no other wait took. With `timeout` (seconds,
        from when the body first reaches this call), raises SignalTimeout once it passes with no signal;
        the body, run again, gets the same answer (payload or timeout)."""
        ev.check_signal_name(name)  # a name no sender may use would be waited for forever
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise InvalidInputError(f"timeout must be a number of seconds or None, got {timeout!r}")
        key = self._wait_key(f"signal:{name}", key)
        self.check()
        for _ in range(_TAKE_ATTEMPTS):
            if key in self._state.taken:
                index = self._state.taken[key]
                if index is None:
                    raise SignalTimeout(f"no signal {name!r} came within the wait's timeout ({key})")
                return self._engine.signal_payload(self._run, index)
            index = self._run.untaken_signal(name)
            waits = self._state.waits
            until = (
                waits[key]
                if key in waits
                else None
                if timeout is None
                else _now() + timedelta(seconds=timeout)
            )
            if index is None and (until is None or _now() < until):
                raise NodeSuspended(key, until, name)
            taken = new.signal_taken(
                run_id=self.run_id, node=self.node, attempt=self.attempt, key=key, name=name, index=index
            )
            try:
                # At the version this node knows: a sibling wait that took the same signal first wins.
                self._write([taken], expected_version=self._run.version)
            except WrongExpectedVersionError:
                self._engine.catch_up(self._run)
                continue
            self._state.taken[key] = index
            if index is not None:
                self._run.signals_taken.add(index)
        raise ConflictError(f"run {self.run_id}: the run changed too often while taking signal {name!r}")

    def cancelled(self) -> None:
        """Raise RunCancelled now if the run was cancelled (for nodes with long stretches between writes)."""
        claim = self._claim
        # One statement, on its own: it only reads the claim's row (and touches its progress time).
        with fenced_writes(), self._engine.store.pool.connection() as conn:
            queue_node_ends.fence(conn, claim.run_id, claim.node, claim.token)


def _now() -> datetime:
    return datetime.now(UTC)


__all__ = ["NodeContext", "RunCancelled", "SignalTimeout"]

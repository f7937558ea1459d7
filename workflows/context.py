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
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from eventstore import ConflictError, InvalidInputError, WrongExpectedVersionError
from workflows import event_models as em
from workflows import new_events as new
from workflows.errors import ContinueAsNew, RepeatedStepKeyError, RunCancelled, SignalTimeout
from workflows.limits import step_slots
from workflows.node_context_base import TAKE_ATTEMPTS
from workflows.node_waits import NodeContextWaits
from workflows.run_starts import fingerprint

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the item type


class NodeContext(NodeContextWaits):
    """What a node function gets (see above): checkpoints, memoized steps, child runs, a successor and
    tags, beside the waits (`workflows.node_waits`) and the checks and writes they rest on
    (`workflows.node_context_base`)."""

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
        for _ in range(TAKE_ATTEMPTS):
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


__all__ = ["NodeContext", "RunCancelled", "SignalTimeout"]

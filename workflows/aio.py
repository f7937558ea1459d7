"""Where node bodies run: a sync body in the worker's thread, an `async def` body on the worker's event loop.

The worker writes what happens around a body once, as a generator of `NodeSteps`: it does everything
up to the body (claim checks, the run's state, the context), yields the body to run, gets its result
sent in (or its exception thrown in), and records the node's end. Two drivers run that generator:

- `run_in_thread` calls a sync body in place, in the worker's pool thread;
- `NodeLoop.run` runs the steps before and after the body in a small pool of threads for the database
  (they write, and the loop must never wait for a write) and the body as a task on the loop, so a
  thousand bodies awaiting HTTP calls hold one thread, not a thousand.

Both drivers run every step in one `contextvars.Context`, so the log fields and the span the worker
binds around a body are the body's too, whichever thread a step runs in.

An async body can be stopped where a sync one cannot, at any `await`: the loop cancels it when its
lease is lost (the worker's heartbeat finds out), when its timeout passes, and when the worker stops
and its grace period is over. The body sees `asyncio.CancelledError`; the worker's steps get the
reason (NodeLeaseLost, NodeTimeout, WorkerStopping) and end the node as they would a sync one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import threading
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from workflows.async_context import AsyncNodeContext
from workflows.context import NodeContext
from workflows.errors import WorkerStopping
from workflows.workflow_registry import WorkflowRegistry

R = TypeVar("R")


@dataclass(frozen=True)
class Body:
    """A node's body to run: `fn(ctx)`, under the claim's fencing `token`."""

    fn: Callable[..., Any]
    ctx: NodeContext
    token: int


#: What the worker does around a body: yields the body once, returns what it returns after the body.
NodeSteps = Generator[Body, Any, R]


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether a node's function is an `async def` one, whose body runs on the worker's event loop."""
    return inspect.iscoroutinefunction(fn)


@dataclass(frozen=True)
class Kinds:
    """A registry's workflows by where their nodes' bodies run, for claiming: sync ones in the worker's
    threads, `async def` ones on its event loop."""

    #: Workflows with a sync node (claimed for the threads).
    threaded: list[str]
    #: Workflows whose nodes are all `async def` (claimed for the event loop).
    on_loop: list[str]
    #: Whether a workflow has nodes of both kinds.
    mixed: bool

    @property
    def any_async(self) -> bool:
        return bool(self.on_loop) or self.mixed

    @classmethod
    def of(cls, registry: WorkflowRegistry) -> Kinds:
        kinds: dict[str, set[bool]] = {}
        for wf in registry.definitions():  # every version: a run goes on with the one it started with
            kinds.setdefault(wf.name, set()).update(is_async(spec.fn) for spec in wf.nodes.values())
        return cls(
            threaded=[name for name, k in kinds.items() if False in k],
            on_loop=[name for name, k in kinds.items() if k == {True}],
            mixed=any(len(k) == 2 for k in kinds.values()),
        )

    def budgets(self, threads_free: int, loop_free: int) -> list[tuple[list[str], int]]:
        """What to claim, as (workflows, how many), with so many threads and places on the loop free:
        never more sync nodes than free threads, nor more async ones than free places. A workflow whose
        nodes are all `async def` is claimed for the loop; any other for the threads, and, when one mixes
        both kinds, never more than the loop has room for either."""
        budgets: list[tuple[list[str], int]] = []
        for_threads = min(threads_free, loop_free) if self.mixed else threads_free
        if self.threaded and for_threads > 0:
            budgets.append((self.threaded, for_threads))
            loop_free -= for_threads if self.mixed else 0
        if self.on_loop and loop_free > 0:
            budgets.append((self.on_loop, loop_free))
        return budgets


class StartedTogether:
    """Nodes a worker starts at once (a batch it took back): none of their ends is recorded before every
    one of their bodies has been entered, or `patience` seconds have passed. Ending a node costs the worker
    more CPU than starting one, so without this the first nodes to finish would hold the last ones back from
    starting: after a restart or a takeover of a thousand nodes, the last started only once nearly all
    the others had ended."""

    def __init__(self, count: int, patience: float = 2.0) -> None:
        self._left = count
        self._lock = threading.Lock()
        self._all = threading.Event()
        self._patience = patience
        if count <= 0:
            self._all.set()

    def entered(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self._all.set()

    def wait(self) -> None:
        self._all.wait(self._patience)


def run_in_thread(steps: NodeSteps[R], *, together: StartedTogether | None = None) -> R:
    """Drive `steps` in the calling thread, calling the (sync) body in place; with `together`, its end is
    recorded only once every body started with it has been entered."""
    try:
        try:
            body = next(steps)
        finally:
            if together is not None:
                together.entered()
        try:
            output = body.fn(body.ctx)
        except BaseException as exc:
            if together is not None:
                together.wait()
            steps.throw(exc)
        else:
            if together is not None:
                together.wait()
            steps.send(output)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise RuntimeError("a node's steps yield one body")


def _advance(steps: NodeSteps[R], how: Callable[..., Body], arg: Any) -> tuple[bool, Any]:
    """One step of `steps` (in a pool thread): (True, the body) or (False, what the steps returned).
    StopIteration never leaves here: a future cannot carry it."""
    try:
        return True, how(arg)
    except StopIteration as done:
        return False, done.value


class _Running:
    """An async body running on the loop, and why it was stopped, if it was (touched on the loop only)."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.reason: BaseException | None = None

    def interrupt(self, reason: BaseException) -> None:
        if self.reason is None and not self.task.done():
            self.reason = reason
            self.task.cancel()


class NodeLoop:
    """An event loop in its own thread for `async def` bodies, started when the first one comes, and a
    pool of `io_threads` threads for their blocking calls (the database)."""

    def __init__(self, *, io_threads: int, name: str = "ledgerflow") -> None:
        self._name = name
        self._io = concurrent.futures.ThreadPoolExecutor(io_threads, thread_name_prefix=f"{name}-node-io")
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._drivers: set[concurrent.futures.Future[Any]] = set()
        #: The bodies running now, by their claim's token (touched on the loop's thread only).
        self._bodies: dict[int, _Running] = {}

    def submit(self, driver: Callable[[], Coroutine[Any, Any, Any]]) -> concurrent.futures.Future[Any]:
        """Run the coroutine `driver()` on the loop; thread-safe."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name=f"{self._name}-node-loop", daemon=True
                )
                self._thread.start()
            future = asyncio.run_coroutine_threadsafe(driver(), self._loop)
            self._drivers.add(future)
        future.add_done_callback(self._driver_done)
        return future

    def _driver_done(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._drivers.discard(future)

    def interrupt(self, token: int, reason: BaseException) -> None:
        """Stop the body running under `token`, if it runs on this loop, with `reason`; thread-safe."""

        def stop() -> None:
            if (running := self._bodies.get(token)) is not None:
                running.interrupt(reason)

        self._on_loop(stop)

    def interrupt_all(self, reason: Callable[[], BaseException]) -> None:
        """Stop every body running on this loop, each with a `reason()` of its own; thread-safe."""

        def stop() -> None:
            for running in list(self._bodies.values()):
                running.interrupt(reason())

        self._on_loop(stop)

    def _on_loop(self, fn: Callable[[], object]) -> None:
        with self._lock:
            loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the drivers running (their bodies interrupted already), then
        stop the loop and its threads."""
        with self._lock:
            drivers, loop, thread = set(self._drivers), self._loop, self._thread
        if drivers:
            concurrent.futures.wait(drivers, timeout=timeout)
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            if not thread.is_alive():
                loop.close()
        self._io.shutdown(wait=False, cancel_futures=True)

    async def run(self, steps: NodeSteps[R]) -> R:
        """Drive `steps`: the steps before and after the body in the pool, the body as a task here."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()

        def advance(how: Callable[..., Body], arg: Any) -> asyncio.Future[tuple[bool, Any]]:
            # Every step in the one context: tokens the steps set (log fields, the span) reset there.
            return loop.run_in_executor(self._io, context.run, _advance, steps, how, arg)

        moved, found = await advance(steps.send, None)
        if not moved:
            return found  # type: ignore[no-any-return]
        body: Body = found
        try:
            coroutine = body.fn(AsyncNodeContext(body.ctx, self._io))
            if not asyncio.iscoroutine(coroutine):
                raise TypeError(f"node {body.ctx.node!r} is not an async def function")
        except BaseException as exc:
            return await self._end(advance, steps.throw, exc)  # type: ignore[no-any-return]
        # The body runs in the same context as the steps around it (they never run at the same time).
        task = loop.create_task(coroutine, context=context)
        running = self._bodies[body.token] = _Running(task)
        deadline = body.ctx.deadline  # time.monotonic(), which is the loop's clock too
        timer = None if deadline is None else loop.call_at(deadline, running.interrupt, body.ctx.timed_out())
        outcome: tuple[Callable[..., Body], Any]
        try:
            try:
                output = await task
            except asyncio.CancelledError as cancelled:
                current = asyncio.current_task()
                if running.reason is None and current is not None and current.cancelling():
                    # This driver is cancelled (the loop is going away): the node is handed back.
                    running.reason = WorkerStopping("the worker's event loop is stopping")
                outcome = (steps.throw, running.reason or cancelled)
            except BaseException as exc:
                outcome = (steps.throw, running.reason or exc)
            else:
                # A body that caught its cancellation and returned is ended for the reason it was stopped.
                outcome = (steps.throw, running.reason) if running.reason else (steps.send, output)
        finally:
            if timer is not None:
                timer.cancel()
            self._bodies.pop(body.token, None)
        return await self._end(advance, *outcome)  # type: ignore[no-any-return]

    @staticmethod
    async def _end(
        advance: Callable[[Callable[..., Body], Any], asyncio.Future[tuple[bool, Any]]],
        how: Callable[..., Body],
        arg: Any,
    ) -> Any:
        """The steps after the body, given its output (`steps.send`) or exception (`steps.throw`)."""
        # Shielded: once the node's end is being recorded, it is recorded whatever befalls this driver.
        moved, found = await asyncio.shield(advance(how, arg))
        if moved:
            raise RuntimeError("a node's steps yield one body")
        return found


__all__ = ["Body", "Kinds", "NodeLoop", "NodeSteps", "is_async", "run_in_thread"]

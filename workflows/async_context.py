"""What an `async def` node gets: the calls of `NodeContext`, under the same names, to be awaited.

    @flow.node()
    async def fetch(ctx: AsyncNodeContext) -> dict[str, Any]:
        page = await ctx.step("page", lambda: client.get(url))   # paid once, as ctx.step
        await ctx.progress(1, 2)
        await ctx.sleep(60)                                        # durable, as ctx.sleep
        return page

The same names rather than an `a`-prefixed twin of each call on `NodeContext`, as psycopg's
`AsyncConnection` beside its `Connection`: an async body reads like a sync one with `await` in front,
and mypy reports a call whose `await` was forgotten (`unused-coroutine`).

Each call is `NodeContext`'s own, run in the worker's small pool of threads for the database, so that
the event loop never waits for a write and the guarantees are those of a sync node: every write is
fenced, every call checks for shutdown and the node's timeout, and cancellation and a lost lease are
found by the next write. A node's calls are made one at a time, in the order the body makes them (the
order numbers its waits); the functions of several steps may run at once (`asyncio.gather`), but
several waits at once need their own `key=`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from workflows import event_models as em
from workflows.context import NodeContext

T = TypeVar("T")


class AsyncNodeContext:
    def __init__(self, sync: NodeContext, io: Executor) -> None:
        self._sync = sync
        self._io = io
        # One call at a time, as a sync body makes them: the node's copy of its run is not shared.
        self._serial = asyncio.Lock()
        # The node's own claim and engine, for the checks made before its body runs (workflows/limits.py).
        self._claim = sync._claim
        self._engine = sync._engine
        self.worker: str = sync.worker
        self.run_id: uuid.UUID = sync.run_id
        self.tenant: str = sync.tenant
        self.workflow: str = sync.workflow
        self.node: str = sync.node
        self.attempt: int = sync.attempt
        self.generation: int = sync.generation
        self.input: Any = sync.input
        self.config: dict[str, Any] = sync.config
        self.outputs: dict[str, Any] = sync.outputs

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in a thread of the pool, one call of this node at a time."""
        loop = asyncio.get_running_loop()
        async with self._serial:
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            running = loop.run_in_executor(self._io, call)
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                # The write goes on in its thread: let it end before the node's end is recorded, so that
                # the node's copy of its run is never advanced by two threads at once.
                await asyncio.wait({running})
                if not running.cancelled():
                    running.exception()  # seen: the cancellation is what the body gets
                raise

    # -- checks (no I/O: called in place) --------------------------------------------------------------

    def check(self) -> None:
        """Raise if the node must stop: the worker is shutting down or the attempt ran out of time."""
        self._sync.check()

    async def cancelled(self) -> None:
        """Raise RunCancelled now if the run was cancelled (for nodes with long stretches between calls)."""
        await self._call(self._sync.cancelled)

    # -- progress and checkpoints ------------------------------------------------------------------------

    async def progress(self, current: int, total: int | None = None, message: str = "") -> None:
        """Report progress. Written at most every 0.25 s (and always when current reaches total)."""
        await self._call(self._sync.progress, current, total, message)

    def checkpointed(self, item: str) -> tuple[bool, Any]:
        """(True, output) if `item` was finished by this or an earlier attempt of the node."""
        return self._sync.checkpointed(item)

    async def checkpoint(self, item: str, output: Any = None) -> None:
        """Record an item's output and its checkpoint together, in one event."""
        await self._call(self._sync.checkpoint, item, output)

    @property
    def checkpoints(self) -> dict[str, Any]:
        return self._sync.checkpoints

    # -- memoized steps ------------------------------------------------------------------------------------

    async def step(self, key: str, fn: Callable[[], Awaitable[T] | T]) -> T:
        """The result of `fn()` (awaited when it is awaitable: a coroutine function, or a function that
        returns one), computed once: recorded in the log and returned from there on retry/resume."""
        done, recorded = self._sync.memoized(key)
        if done:
            return recorded  # type: ignore[no-any-return]
        result = fn()
        value: T = await result if inspect.isawaitable(result) else result
        await self._call(self._sync.record_step, key, value)
        return value

    # -- child workflows -----------------------------------------------------------------------------------

    async def start_workflow(
        self,
        workflow: str,
        *,
        input: Any = None,
        key: str | None = None,
        child_key: str = "default",
        parent_close: em.ParentClose = "cancel",
    ) -> uuid.UUID:
        """Start another workflow exactly once for this node, however often the node is retried; see
        NodeContext.start_workflow for `parent_close`."""
        return await self._call(
            self._sync.start_workflow,
            workflow,
            input=input,
            key=key,
            child_key=child_key,
            parent_close=parent_close,
        )

    # -- continuing as a new run ---------------------------------------------------------------------------

    def continue_as_new(self, input: Any = None, *, tags: Mapping[str, str] | None = None) -> NoReturn:
        """End this run and start its successor with `input` (see NodeContext.continue_as_new). No I/O, so
        not awaited: it raises at once, and the worker records the end and the start in one transaction."""
        self._sync.continue_as_new(input, tags=tags)

    # -- tags --------------------------------------------------------------------------------------------

    async def set_tags(self, tags: Mapping[str, str | None]) -> None:
        """Set tags on the run (see NodeContext.set_tags)."""
        await self._call(self._sync.set_tags, tags)

    # -- waiting -----------------------------------------------------------------------------------------

    async def sleep(self, seconds: float, *, key: str | None = None) -> None:
        """Wait `seconds`, durably (see NodeContext.sleep): not `asyncio.sleep`, which a crash forgets."""
        await self._call(self._sync.sleep, seconds, key=key)

    async def sleep_until(self, when: datetime, *, key: str | None = None) -> None:
        """Wait, durably, until `when` (a datetime with a time zone)."""
        await self._call(self._sync.sleep_until, when, key=key)

    async def wait_for_signal(
        self, name: str, *, timeout: float | None = None, key: str | None = None
    ) -> Any:
        """The payload of a signal `name` sent to the run, waiting durably for it (see
        NodeContext.wait_for_signal)."""
        return await self._call(self._sync.wait_for_signal, name, timeout=timeout, key=key)


__all__ = ["AsyncNodeContext"]

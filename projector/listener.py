"""Many readers waiting for their own writes, on one connection: a server's shared listener.

`wait_for` holds a thread and a connection of its own for as long as it waits; a server that let every
request wait that way would give both away to whoever sends the most waiting reads. `ProjectionWaiters`
serves every wait of one server (asyncio) with one thread that LISTENs on one connection of its own, and
one look at a time at the projection's cursor (a pool connection for the look only):

* a waiter is a future; it holds no thread and no connection while it waits;
* a notification for a projection (migration 0017: one per projector batch) makes one look at that
  projection's cursor, which answers every waiter of it at once (`waiting.reach`);
* a new waiter is looked at at once (an advance may have come between its first look and now), and every
  projection with waiters again every `recheck` seconds: for the change no notification announces (an
  older transaction ending lets the log's horizon pass a write), and for notifications missed while the
  listening connection was lost;
* waiters are capped in total and per tenant: beyond, `TooManyWaitersError`, at once.

Why `waiting.wait_for` stays beside it: it is the library's read-your-writes call (the README's, the
benchmarks'), for code with no event loop and no long-lived listener of its own, a script or a node that
appended and reads next; one caller waits there, for itself, so a connection for the wait is its own cost
and nobody else's. This class needs a running event loop and a listener thread started with the server,
and pays off only where many waits share them. The two share what matters: one look at a projection
(`waiting.reach`, the same answer to "has it passed this cursor") and one notification channel (migration
0017). The API uses `wait_for` only with `timeout=0`, for its one first look (which also refuses a cursor
beyond every committed write, 422), on the request's own thread and pool connection; every wait after it is
this class's.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
import structlog

from eventstore import Cursor, EventStore, LedgerflowError
from eventstore.spi import connect
from projector.projection import Projection
from projector.waiting import ProjectionBehindError, Q, Reach, reach

log = structlog.get_logger(__name__)

_CONNECT_TIMEOUT = 5
#: How long one round of listening lasts before the stop flag is looked at again: the longest a stop waits
#: for the listener. A round that ends without a notification costs a wake of this thread, no round trip.
_LISTEN_ROUND = 0.1
_RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 5.0)


class TooManyWaitersError(LedgerflowError):
    """As many reads wait for a projection as are allowed (in total, or for the tenant); nothing was read.
    Ask again shortly."""

    code = "too_many_waiters"

    def __init__(self, scope: Literal["total", "tenant"], limit: int, tenant: str) -> None:
        self.scope, self.limit, self.tenant = scope, limit, tenant
        whose = "on this server" if scope == "total" else f"for tenant {tenant!r}"
        super().__init__(f"{limit} reads already wait for a projection {whose}, the most allowed; ask again")

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit, "scope": self.scope}


@dataclass(eq=False)
class _Waiter:
    projection: Projection
    wanted: Cursor
    tenant: str
    future: asyncio.Future[Cursor]
    last: Reach = field(default_factory=lambda: Reach(None))


class ProjectionWaiters:
    """Read-your-writes waits of one server (see the module). `start` and `wait_for` run on its event
    loop; `stop` ends the listener thread."""

    def __init__(
        self,
        store: EventStore,
        *,
        max_waiters: int,
        max_waiters_per_tenant: int,
        recheck: float = 0.25,
        name: str = "ledgerflow-listener",
    ) -> None:
        self._store = store
        self._max_total = max_waiters
        self._max_per_tenant = max_waiters_per_tenant
        self._recheck = recheck
        self._name = name
        self._waiting: dict[str, set[_Waiter]] = {}
        self._per_tenant: Counter[str] = Counter()
        self._due: set[str] = set()
        self._kick = asyncio.Event()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checker: asyncio.Task[None] | None = None
        self._listener: threading.Thread | None = None
        # One look at a time, on a thread of its own: never behind the requests' thread pool.
        self._looks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projection-looks")

    @property
    def waiting(self) -> int:
        return sum(self._per_tenant.values())

    def start(self) -> None:
        # Afresh at every start: an app's lifespan may run again (a test client per test).
        self._stopping.clear()
        self._looks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projection-looks")
        self._loop = asyncio.get_running_loop()
        self._checker = self._loop.create_task(self._check_forever())
        self._listener = threading.Thread(target=self._listen_forever, name=self._name, daemon=True)
        self._listener.start()

    async def stop(self) -> None:
        self._stopping.set()
        if self._checker is not None:
            self._checker.cancel()
        for waiters in self._waiting.values():
            for w in waiters:
                w.future.cancel()
        if self._listener is not None:
            await asyncio.to_thread(self._listener.join, _LISTEN_ROUND + _CONNECT_TIMEOUT)
        self._looks.shutdown(wait=False, cancel_futures=True)

    def check_room(self, tenant: str) -> None:
        """TooManyWaitersError if one more wait of `tenant` would pass a cap now: lets a caller refuse a
        read before it spends a look on it (`wait_for` checks again)."""
        # The tenant's own cap first: a tenant at its cap hears that it is its own doing.
        if self._per_tenant[tenant] >= self._max_per_tenant:
            raise TooManyWaitersError("tenant", self._max_per_tenant, tenant)
        if self.waiting >= self._max_total:
            raise TooManyWaitersError("total", self._max_total, tenant)

    async def wait_for(
        self, projection: Projection, wanted: Cursor, *, timeout: float, tenant: str
    ) -> Cursor:
        """The projection's cursor once it has passed `wanted`; ProjectionBehindError after `timeout`
        seconds, TooManyWaitersError at once when the caps are reached. A waiter cancelled (its caller went
        away) gives its place back at once."""
        self.check_room(tenant)
        waiter = _Waiter(projection, wanted, tenant, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(projection.name, set()).add(waiter)
        self._per_tenant[tenant] += 1
        self._wake(projection.name)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except TimeoutError:
            log.info("projection_wait_timed_out", projection=projection.name, wanted=str(wanted))
            raise ProjectionBehindError(projection.name, waiter.last.at, wanted, timeout) from None
        finally:
            self._forget(waiter)

    def _forget(self, waiter: _Waiter) -> None:
        waiters = self._waiting.get(waiter.projection.name)
        if waiters is not None and waiter in waiters:
            waiters.discard(waiter)
            if not waiters:
                del self._waiting[waiter.projection.name]
            self._per_tenant[waiter.tenant] -= 1
            if self._per_tenant[waiter.tenant] <= 0:
                del self._per_tenant[waiter.tenant]

    def _wake(self, name: str | None) -> None:
        """On the loop: look at `name` (every projection with waiters for None) soon."""
        if name is None:
            self._due.update(self._waiting)
        elif name in self._waiting:
            self._due.add(name)
        else:
            return
        self._kick.set()

    async def _check_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self._recheck if self._waiting else None)
            except TimeoutError:
                self._due.update(self._waiting)
            self._kick.clear()
            due, self._due = self._due, set()
            for name in due:
                waiters = self._waiting.get(name)
                if not waiters:
                    continue
                projection = next(iter(waiters)).projection
                try:
                    found = await loop.run_in_executor(self._looks, self._look, projection)
                except Exception as exc:  # e.g. the database is away: the next round looks again
                    log.warning("projection_wait_look_failed", projection=name, error=str(exc))
                    continue
                for w in list(self._waiting.get(name, ())):
                    w.last = found
                    if found.passed(w.wanted) and not w.future.done():
                        w.future.set_result(found.at or w.wanted)

    def _look(self, projection: Projection) -> Reach:
        with self._store.pool.connection() as conn:
            return reach(self._store, projection, conn)

    def _call(self, fn: Callable[[str | None], None], name: str | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, name)

    def _listen_forever(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                with connect(
                    self._store.url,
                    autocommit=True,
                    application_name=self._name,
                    connect_timeout=_CONNECT_TIMEOUT,
                ) as conn:
                    conn.execute(Q["listen_projections"])
                    if failures:
                        log.info("projection_listener_restored")
                    failures = 0
                    # Advances while not listening were not announced: look at everything once.
                    self._call(self._wake, None)
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=_LISTEN_ROUND):
                            self._call(self._wake, note.payload)
            except psycopg.Error as exc:
                failures += 1
                if failures == 1:
                    log.warning("projection_listener_lost", error=str(exc))
                self._stopping.wait(_RECONNECT_BACKOFF[min(failures, len(_RECONNECT_BACKOFF)) - 1])

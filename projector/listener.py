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

A wait for something no cursor names in advance (a workflow run's end: the cursor of its last event is not
known while it runs) is a `Watch`: a condition on the projection's tables, answered for every waiter of
the watch by one query in the same look, at the same moments as the cursor waits (a notification of the
projection, a new waiter, every `recheck`). It is the same listener, the same caps and the same looks: a
run's end is announced by the batch of the projection that writes it, as a write is.

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
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

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
    """As many waits for a projection (reads of one's writes, watches such as a run's end) as are allowed
    (in total, or for the tenant); nothing was read. Ask again shortly."""

    code = "too_many_waiters"

    def __init__(self, scope: Literal["total", "tenant"], limit: int, tenant: str) -> None:
        self.scope, self.limit, self.tenant = scope, limit, tenant
        whose = "on this server" if scope == "total" else f"for tenant {tenant!r}"
        super().__init__(
            f"{limit} requests already wait for a projection {whose}, the most allowed; ask again"
        )

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit, "scope": self.scope}


K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, eq=False)
class Watch(Generic[K]):
    """A condition on `projection`'s tables that waits share (see the module): `look(conn, keys)` answers,
    in one query for every waiter of the watch, the keys whose condition holds now, each with what it
    found there (never None). Compared by identity: declare each watch once, at module level."""

    name: str
    projection: Projection
    look: Callable[[psycopg.Connection[Any], frozenset[K]], Mapping[K, Any]]


@dataclass(eq=False)
class _Waiter:
    projection: Projection
    tenant: str
    future: asyncio.Future[Any]
    #: What a cursor wait waits for (None for a watch's waiter).
    wanted: Cursor | None = None
    last: Reach = field(default_factory=lambda: Reach(None))
    #: A watch's waiter: the watch and the key it waits for.
    watch: Watch[Any] | None = None
    key: Hashable = None


@dataclass(frozen=True)
class _Found:
    """One look at a projection: its reach (None when no cursor waits), and what each watch found."""

    reach: Reach | None
    held: dict[Watch[Any], Mapping[Any, Any]]


class ProjectionWaiters:
    """Read-your-writes waits and watches of one server (see the module). `start`, `wait_for` and
    `wait_until` run on its event loop; `stop` ends the listener thread."""

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
        waiter = self._join(_Waiter(projection, tenant, self._future(), wanted=wanted))
        try:
            found: Cursor = await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
            return found
        except TimeoutError:
            log.info("projection_wait_timed_out", projection=projection.name, wanted=str(wanted))
            raise ProjectionBehindError(projection.name, waiter.last.at, wanted, timeout) from None
        finally:
            self._forget(waiter)

    async def wait_until(self, watch: Watch[K], key: K, *, timeout: float, tenant: str) -> Any:
        """What `watch` found for `key` once its condition holds; TimeoutError after `timeout` seconds
        (the caller answers for itself: a watch has no cursor to name), TooManyWaitersError at once when
        the caps are reached. Counted under the same caps as the cursor waits; a waiter cancelled gives its
        place back at once."""
        waiter = self._join(_Waiter(watch.projection, tenant, self._future(), watch=watch, key=key))
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        finally:
            self._forget(waiter)

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def _join(self, waiter: _Waiter) -> _Waiter:
        self.check_room(waiter.tenant)
        self._waiting.setdefault(waiter.projection.name, set()).add(waiter)
        self._per_tenant[waiter.tenant] += 1
        self._wake(waiter.projection.name)  # it may have come true between the caller's look and now
        return waiter

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
                cursors = any(w.watch is None for w in waiters)
                keys: dict[Watch[Any], set[Any]] = {}
                for w in waiters:
                    if w.watch is not None:
                        keys.setdefault(w.watch, set()).add(w.key)
                try:
                    found = await loop.run_in_executor(self._looks, self._look, projection, cursors, keys)
                except Exception as exc:  # e.g. the database is away: the next round looks again
                    log.warning("projection_wait_look_failed", projection=name, error=str(exc))
                    continue
                for w in list(self._waiting.get(name, ())):
                    if w.future.done():
                        continue
                    if w.watch is not None:
                        held = found.held.get(w.watch, {})
                        if w.key in held:
                            w.future.set_result(held[w.key])
                    elif found.reach is not None and w.wanted is not None:
                        w.last = found.reach
                        if found.reach.passed(w.wanted):
                            w.future.set_result(found.reach.at or w.wanted)

    def _look(self, projection: Projection, cursors: bool, keys: dict[Watch[Any], set[Any]]) -> _Found:
        """One pool connection, for the look only: the projection's reach (if a cursor waits), then one
        query per watch with waiters."""
        with self._store.pool.connection() as conn:
            at = reach(self._store, projection, conn) if cursors else None
            return _Found(at, {watch: watch.look(conn, frozenset(wanted)) for watch, wanted in keys.items()})

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

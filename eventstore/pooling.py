"""The store's connection pool: no thread waits for a connection while it keeps one, and a stopping
process waits for none longer than it may.

Two behaviours on top of psycopg_pool's `ConnectionPool`:

- **No hold-and-wait.** A thread that appends keeps a pooled connection between appends (see
  `eventstore.pinning`). When that thread then asks the pool for a connection (a node's next read, its
  end's transaction), it would hold one while it waits for another; with every other thread of every
  other process doing the same on a server with few free slots, nobody gets a second one and everybody
  waits out the pool's timeout (hold-and-wait across processes). So before each checkout the thread's
  idle pinned connection goes back to the pool first (`before_checkout`): a thread holds at most one
  connection at a time, and the one it gave back is usually the one it gets. And when no connection is
  free and the pool cannot grow (it is at its size, or the server did not give it one within
  `_GROW_WAIT`), the idle pins of every other thread go back too (`reclaim_idle`) before the thread
  waits on: a thread that appended once and then went quiet (a node thread between nodes, a caller's
  thread) would otherwise keep a connection that a heartbeat or a claim waits for, for as long as the
  pool cannot grow (a server without free slots).
- **Bounded waits while stopping.** Inside `bounded_waits(seconds)`, every checkout of every thread
  waits at most until that deadline (and a moment past it, so that a connection that is free is still
  taken), also a checkout that began waiting before (it is woken and waits on within the deadline): a
  stopping process's last steps (hand nodes back, release leases, a last heartbeat) give up once the
  database has not answered in time instead of waiting the pool's timeout for each; the leases they
  would have released then lapse by themselves. `bounded_once_stopping` sets such a deadline when a
  worker is asked to stop.
- **A server that is away is not waited for.** While the pool's last attempt to open a connection was
  refused (nothing listens, the server is stopping or starting), a checkout that finds no connection free
  waits at most `_AWAY_WAIT` for one instead of the pool's timeout (30 s): the caller's outage handling
  takes over at once, and a request answers 503 in seconds. Other failures keep the pool's timeout: a
  full server's connections come back as other threads give them up, and behind an attempt that timed
  out (a network cut) the pool's connections may still be on their way back.
- **Idle connections go back to the server.** psycopg_pool closes at most one unused connection per
  `max_idle` (600 s by default): after a burst, a pool of ten held its server slots for an hour and a
  half, and on a server with few slots other processes (a listener reconnecting after an outage, a worker
  starting) found none. This pool looks every `max_idle / 2`: a pin its thread has not used since the
  last look goes back to the pool, and every connection the pool did not need during the last look's
  period is closed, down to `min_size` idle ones. So a connection idle for `max_idle` is closed (a pinned
  one within 1.5 x `max_idle`), and a process back at rest holds `min_size` pooled connections again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import psycopg
import psycopg_pool

#: How long a checkout first waits before idle pins are taken back: a connection given back meanwhile is
#: taken as it is.
_FIRST_TRY = 0.02
#: How long a checkout then waits for the pool to grow before idle pins are taken back: opening a
#: connection takes milliseconds, unless the server has no free slot.
_GROW_WAIT = 1.0
#: While it waits on, idle pins are taken back this often.
_RECLAIM_EVERY = 0.1
#: Past a `bounded_waits` deadline, a checkout still waits this long: a free connection is taken, and
#: an unavailable database answers PoolTimeout at once.
_PAST_DEADLINE = 0.05
#: How many looks for idle connections per `max_idle` (see the module).
_IDLE_LOOKS = 2
#: The longest a checkout waits for a connection while the server does not accept any (see the module):
#: long enough for a server that is back to hand one over.
_AWAY_WAIT = 2.0
#: A refused attempt to connect says the server is away for this long (unless an attempt succeeds): a pool
#: at its size makes no new attempts, and one refusal long ago must not cut every later wait short.
_AWAY_FOR = 10.0
#: What libpq says when the server refuses a connection outright (no SQLSTATE to go by).
_REFUSED = (
    "Connection refused",
    "No such file or directory",  # a Unix socket without a server
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
)


class _Refusals:
    """When the server last refused one of a pool's attempts to connect (see the module)."""

    def __init__(self) -> None:
        #: None once an attempt succeeded or failed otherwise.
        self.at: float | None = None

    def note(self, failure: BaseException | None) -> None:
        refused = failure is not None and any(s in str(failure) for s in _REFUSED)
        self.at = time.monotonic() if refused else None

    def away(self) -> bool:
        at = self.at
        return at is not None and time.monotonic() - at < _AWAY_FOR


def _noting_refusals(refusals: _Refusals) -> type[psycopg.Connection[Any]]:
    """The class of a pool's connections: psycopg_pool opens every connection of its own (its attempts to
    grow or reconnect, and `check`) with `connection_class.connect`, the public seam for this; its
    `_connect` around it is private. `reconnect_failed` would not do: it is called only once reconnecting
    has failed for `reconnect_timeout` (minutes), not at each refusal; `configure` sees successes only."""

    class NotingRefusals(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            try:
                conn = super().connect(conninfo, **kwargs)
            except Exception as exc:
                refusals.note(exc)
                raise
            refusals.note(None)
            return conn

    return NotingRefusals


class _NewDeadline(Exception):
    """Wakes a checkout that waits: a deadline was set meanwhile (see `Pool.bounded_waits`)."""


class Pool(psycopg_pool.ConnectionPool[psycopg.Connection[Any]]):
    """A `ConnectionPool` with the store's two additions (see the module's documentation)."""

    def __init__(self, *args: Any, max_idle: float = 10.0, **kwargs: Any) -> None:
        #: Seconds after which an idle connection is closed (psycopg_pool's `max_idle` is the period of
        #: the looks for them, a fraction of it: see the module).
        self.idle_limit = max_idle
        #: Called at each look for idle connections with the look's period: gives back the pins their
        #: threads have not used for that long.
        self.give_back_unused: Callable[[float], object] | None = None
        #: Called before every checkout, in the thread that checks out (the store sets it to give back
        #: that thread's idle pinned connection).
        self.before_checkout: Callable[[], None] | None = None
        #: Called when no connection is free at once: gives back the connections threads keep idle.
        self.reclaim_idle: Callable[[], object] | None = None
        self._deadlines: list[float] = []
        self._deadlines_lock = threading.Lock()
        #: Whether the last attempt to open a connection was refused (see the module).
        self._refusals = _Refusals()
        super().__init__(
            *args,
            connection_class=_noting_refusals(self._refusals),
            max_idle=max_idle / _IDLE_LOOKS,
            **kwargs,
        )

    def _away(self) -> bool:
        """Whether the server refuses connections, as the pool's last attempt found."""
        return self._refusals.away()

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        hook, reclaim = self.before_checkout, self.reclaim_idle
        if hook is not None:
            hook()
        timeout = self._bounded(timeout)
        if self._away():
            timeout = min(timeout, _AWAY_WAIT)
        if reclaim is None or timeout <= _FIRST_TRY:
            return self._wait(timeout)
        deadline = time.monotonic() + timeout
        away = self._away()
        try:
            return self._wait(_FIRST_TRY)
        except psycopg_pool.PoolTimeout:
            pass
        if self.get_stats().get("pool_size", 0) < self.max_size:
            grow = min(_GROW_WAIT, deadline - time.monotonic())
            if grow > 0:
                try:
                    return self._wait(grow)
                except psycopg_pool.PoolTimeout:
                    pass
        # In slices: a pin given back may go to a thread that pins it again (its append) and then sits
        # idle with it; each slice takes such pins back again.
        while True:
            reclaim()
            if not away and self._away():  # the pool found the server away while this checkout waited
                away, deadline = True, min(deadline, time.monotonic() + _AWAY_WAIT)
            left = self._bounded(deadline - time.monotonic())
            try:
                return self._wait(max(min(left, _RECLAIM_EVERY), _PAST_DEADLINE))
            except psycopg_pool.PoolTimeout:
                if left <= _RECLAIM_EVERY:
                    raise

    def _wait(self, timeout: float) -> psycopg.Connection[Any]:
        """psycopg_pool's checkout; woken by a new deadline, it waits on within it."""
        while True:
            began = time.monotonic()
            try:
                return super().getconn(timeout)
            except _NewDeadline:
                timeout = self._bounded(timeout - (time.monotonic() - began))

    def shed_idle(self) -> int:
        """Close every connection no thread uses right now, down to `min_size` idle ones (idle pins first go
        back); returns how many were closed. For a connection of the process's own that a full server
        refused (its listener): the slot an idle pooled connection holds serves the process better there."""
        reclaim = self.reclaim_idle
        if reclaim is not None:
            reclaim()
        unused: list[psycopg.Connection[Any]] = []
        with self._lock:
            while self._above_min_size():
                unused.append(self._pool.popleft())
                self._nconns -= 1
            self._nconns_min = min(self._nconns_min, len(self._pool))
        for conn in unused:
            self._close_connection(conn)
        return len(unused)

    def _above_min_size(self) -> bool:
        """Whether an idle connection may be closed, the pool's lock held: only while more than `min_size`
        sit idle in the pool, not only while psycopg_pool counts more than `min_size` connections. Its count
        includes the connections it is still trying to open, and against a full server those attempts fail
        for minutes: closing down to that count closed the pool's last open connection, and the process
        (a worker whose listener had asked for room) was left with none while every slot of the server was
        held by other processes' connections that nobody would give back."""
        return self._nconns > self._min_size and len(self._pool) > self._min_size

    def _shrink_pool(self) -> None:
        """psycopg_pool's periodic look for idle connections (every `self.max_idle`), which closes one at
        most: here every connection the pool did not need since the last look is closed, down to
        `min_size`, after the pins unused as long went back (see the module)."""
        give_back = self.give_back_unused
        if give_back is not None:
            give_back(self.max_idle)  # closed at the next look unless a thread takes them meanwhile
        unused: list[psycopg.Connection[Any]] = []
        with self._lock:
            # The fewest connections that sat in the pool at once since the last look: that many were
            # never needed meanwhile.
            spare, self._nconns_min = self._nconns_min, len(self._pool)
            while spare > 0 and self._above_min_size():
                # The pool hands out from the left and takes back on the right: the left's idled longest.
                unused.append(self._pool.popleft())
                self._nconns -= 1
                self._nconns_min -= 1
                spare -= 1
        for conn in unused:
            self._close_connection(conn)

    @contextmanager
    def bounded_waits(self, seconds: float) -> Iterator[None]:
        """Within the block, no checkout waits past `seconds` from now (see the module)."""
        deadline = time.monotonic() + seconds
        with self._deadlines_lock:
            self._deadlines.append(deadline)
        # Checkouts already waiting (with the pool's timeout, 30 s) wake and wait on within the deadline.
        # psycopg_pool has no public way to wake its waiters: its queue of them is private (3.2 and
        # later), and `fail` is how its own close() ends their waits.
        with self._lock:
            waiting = list(self._waiting)
        for client in waiting:
            client.fail(_NewDeadline())
        try:
            yield
        finally:
            with self._deadlines_lock:
                self._deadlines.remove(deadline)

    def _bounded(self, timeout: float | None) -> float:
        wanted = self.timeout if timeout is None else timeout
        with self._deadlines_lock:
            deadline = min(self._deadlines, default=None)
        if deadline is None:
            return wanted
        return min(wanted, max(deadline - time.monotonic(), _PAST_DEADLINE))


@contextmanager
def bounded_waits(pool: psycopg_pool.ConnectionPool[Any], seconds: float) -> Iterator[None]:
    """`Pool.bounded_waits` for any pool (another kind of pool is left as it is)."""
    if isinstance(pool, Pool):
        with pool.bounded_waits(seconds):
            yield
    else:
        yield


@contextmanager
def bounded_once_stopping(
    pool: psycopg_pool.ConnectionPool[Any], stopping: threading.Event, seconds: float
) -> Iterator[None]:
    """For the block (a worker's run): from the moment `stopping` is set, every checkout of `pool`,
    those already waiting included, waits at most `seconds` from then. A thread of its own watches for
    it: the stop is usually asked by a signal handler, which must not take the pool's locks (the thread
    it interrupts may hold them)."""
    done = threading.Event()

    def watch() -> None:
        stopping.wait()
        if not done.is_set():
            with bounded_waits(pool, seconds):
                done.wait()

    watcher = threading.Thread(target=watch, name="ledgerflow-stop-deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        stopping.set()  # the run is over: the watcher ends
        watcher.join(timeout=1.0)

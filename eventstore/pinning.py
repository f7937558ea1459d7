"""One pool connection held by each appending thread, instead of a pool checkout per append.

A checkout costs an append about a fifth of its client CPU (the pool's lock, its deque, the return
bookkeeping), and sequential appends that rotate over the pool's idle connections find each backend's
caches cold. So a thread that appends keeps the connection it took, on these terms:

- At most `limit` connections are pinned (by default half the pool), so other work always finds
  connections in the pool. A thread beyond the limit checks out per call, as before.
- A pin goes back to the pool when its thread ends, when the store closes, once the limit is reached
  when it has been idle for `idle_seconds` and another thread needs one, and when its thread has not
  used it for half the pool's `max_idle` (the pool then closes it unless it is needed: see
  `eventstore.pooling`), so that a thread that appended once does not keep a server slot for ever.
- Before each use the connection is probed without blocking; a connection the server closed while it
  sat idle (a terminated backend, a restart) is replaced before anything is sent, so that case never
  makes an append fail. A connection that breaks during an append is given back (the pool discards it)
  and the error raised as usual: whether that append committed cannot be known, exactly as without pins.
- A thread that checks a connection out of the pool gives its idle pin back first, so that no thread
  holds one connection while it waits for another (see `eventstore.pooling`).
- Connections never cross a fork: in a child process the parent's pins are neither used nor closed
  (closing would end the parent's session), and the child checks out per call.
- Pinned connections are autocommit connections that only ever run single statements: they never hold a
  transaction open, so they never hold the log's safe horizon back while they sit idle.
"""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from eventstore import direct
from eventstore.db import turned_read_only

Connection = psycopg.Connection[Any]


class Pin:
    """A connection held for one thread. `lock` is held while the connection is in use, so that no other
    thread takes it back in the middle of an append."""

    __slots__ = ("conn", "cursor", "direct", "last_used", "lock", "pid", "poller", "prepared")

    def __init__(self) -> None:
        self.conn: Connection | None = None
        #: One cursor for all of the thread's appends: a new cursor per statement costs more than the
        #: statement's own parameters.
        self.cursor: psycopg.Cursor[Any] | None = None
        #: Whether `conn` can take `eventstore.direct`'s path, and the statements it prepared there.
        self.direct = False
        self.prepared: set[bytes] = set()
        self.lock = threading.Lock()
        self.last_used = 0.0
        self.pid = os.getpid()
        #: Watches the connection's socket for the liveness probe (see `_alive`); made once per connection.
        self.poller = select.poll()

    def drop(self) -> Connection | None:
        """Let go of the connection (to give it back); returns it."""
        conn, self.conn, self.cursor = self.conn, None, None
        return conn

    def hold(self, conn: Connection) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.direct = direct.usable(conn)
        self.prepared = set()
        self.poller = select.poll()
        self.poller.register(conn.pgconn.socket, select.POLLIN)


class _Owner:
    """Lives in the thread-local storage of the pinning thread: when the thread ends, it is dropped and its
    finalizer gives the connection back."""

    __slots__ = ("__weakref__", "pin")

    def __init__(self, pin: Pin) -> None:
        self.pin = pin


class PinnedConnections:
    """Per-thread pinned connections taken from `pool` (see the module's documentation)."""

    def __init__(self, pool: psycopg_pool.ConnectionPool, *, limit: int, idle_seconds: float = 1.0) -> None:
        self._pool = pool
        self.limit = limit
        self.idle_seconds = idle_seconds
        self._pid = os.getpid()
        self._local = threading.local()
        #: Pins that hold a connection. Guarded by `_lock`.
        self._held: set[Pin] = set()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def held(self) -> int:
        """How many connections are pinned right now."""
        return len(self._held)

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """This thread's pinned connection, or a connection checked out for this call only."""
        pin = self._lock_pin()
        if pin is None:
            with self._pool.connection() as checked_out:
                yield checked_out
            return
        try:
            assert pin.conn is not None
            yield pin.conn
        finally:
            self.release()

    def acquire(self) -> Pin | None:
        """This thread's pin, its connection live, for one use: end the use with `release`. None when
        this thread cannot have one: then check a connection out of the pool for the call.

        The hot path's form of `connection()`, without a generator to drive."""
        return self._lock_pin()

    def release(self) -> None:
        """End this thread's use of its pinned connection. A connection that broke during the use goes
        back to the pool, which discards it; the thread's next use takes another."""
        pin: Pin = self._local.owner.pin
        try:
            conn = pin.conn
            if conn is not None and (conn.closed or conn.broken):
                self._unpin(pin)
            else:
                pin.last_used = time.monotonic()
        finally:
            pin.lock.release()

    def give_back_idle(self) -> None:
        """Give this thread's pinned connection back to the pool unless it is in use: the thread is about
        to check another out, and must not keep one while it waits for a second (see
        `eventstore.pooling`). Its next append pins again."""
        owner: _Owner | None = getattr(self._local, "owner", None)
        if owner is None or owner.pin.conn is None or os.getpid() != self._pid:
            return
        pin = owner.pin
        # Not blocking: this thread itself may hold the lock (it is taking a connection for the pin).
        if not pin.lock.acquire(blocking=False):
            return
        try:
            if pin.conn is not None:
                self._unpin(pin)
        finally:
            pin.lock.release()

    def give_back_all_idle(self) -> int:
        """Give back every pinned connection not in use (another thread waits for a connection and none is
        free); returns how many. Their threads pin again at their next append."""
        with self._lock:
            pins = list(self._held)
        given = 0
        for pin in pins:
            if not pin.lock.acquire(blocking=False):
                continue  # in use: its append ends soon, and gives it back to its thread, not the pool
            try:
                if pin.conn is not None:
                    self._unpin(pin)
                    given += 1
            finally:
                pin.lock.release()
        return given

    def give_back_unused(self, seconds: float) -> int:
        """Give back every pinned connection not used for `seconds` (the pool's look for idle
        connections); returns how many."""
        now = time.monotonic()
        with self._lock:
            pins = [pin for pin in self._held if now - pin.last_used >= seconds]
        given = 0
        for pin in pins:
            if not pin.lock.acquire(blocking=False):
                continue  # in use right now
            try:
                if pin.conn is not None and time.monotonic() - pin.last_used >= seconds:
                    self._unpin(pin)
                    given += 1
            finally:
                pin.lock.release()
        return given

    def _lock_pin(self) -> Pin | None:
        """This thread's pin, locked and holding a live connection; None when it cannot have one."""
        if self._closed or self.limit < 1 or os.getpid() != self._pid:
            return None
        owner: _Owner | None = getattr(self._local, "owner", None)
        if owner is None:
            owner = _Owner(Pin())
            self._local.owner = owner
            # A plain function with no reference to `self`: the store can be collected while the thread lives.
            weakref.finalize(owner, _give_back, self._pool, owner.pin, self._held, self._lock)
        pin = owner.pin
        pin.lock.acquire()
        try:
            if pin.conn is not None and not _alive(pin.conn, pin.poller):
                self._unpin(pin)
            if pin.conn is None and not self._take(pin):
                pin.lock.release()
                return None
        except BaseException:
            pin.lock.release()
            raise
        return pin

    def _take(self, pin: Pin) -> bool:
        """Give `pin` a connection from the pool, within the limit (reclaiming an idle pin if need be)."""
        with self._lock:
            if len(self._held) >= self.limit and not self._reclaim_idle():
                return False
            # Counted before the checkout, so two threads cannot both pass the limit.
            self._held.add(pin)
        try:
            pin.hold(self._live_connection())
        except BaseException:
            with self._lock:
                self._held.discard(pin)
            raise
        return True

    def _live_connection(self) -> Connection:
        """A connection from the pool that is still open. After a restart every idle connection of the
        pool is dead; the pool discards each one given back and opens a new one in its place."""
        for _ in range(self._pool.max_size):
            conn = self._pool.getconn()
            if _alive(conn, None):
                return conn
            self._pool.putconn(conn)
        return self._pool.getconn()

    def _reclaim_idle(self) -> bool:
        """Give back one pin idle for `idle_seconds`, if there is one (called with `_lock` held)."""
        now = time.monotonic()
        for other in self._held:
            if now - other.last_used < self.idle_seconds or not other.lock.acquire(blocking=False):
                continue
            try:
                poller = other.poller
                conn = other.drop()
                self._held.discard(other)
            finally:
                other.lock.release()
            if conn is not None:
                _put_back(self._pool, conn, poller)
            return True
        return False

    def _unpin(self, pin: Pin) -> None:
        """Give `pin`'s connection back (called with `pin.lock` held); the pool discards a broken one."""
        poller = pin.poller
        conn = pin.drop()
        with self._lock:
            self._held.discard(pin)
        if conn is not None:
            _put_back(self._pool, conn, poller)

    def close(self) -> None:
        """Give every pinned connection back to the pool; later calls check out per call."""
        self._closed = True
        if os.getpid() != self._pid:
            return  # the pins are the parent's (see `_give_back`)
        with self._lock:
            pins = list(self._held)
        for pin in pins:
            with pin.lock:
                self._unpin(pin)


def _alive(conn: Connection, poller: select.poll | None) -> bool:
    """Whether an idle connection is still open, without blocking and without a round trip; one the
    server has ended is closed here, so that the pool discards it when it is given back.

    An idle autocommit connection receives nothing unasked, so a readable socket means the server spoke:
    a terminated backend or a restart sends its last words (a FATAL error), then ends the stream. The end
    may come later than the words: the backend leaves pg_stat_activity before it closes its socket, and
    until the end is read libpq reports the connection as OK (it hands an error that comes unasked to the
    notice processor). So the words alone condemn it. `poller`: one already watching its socket.
    """
    if conn.closed or conn.broken or turned_read_only(conn):
        return False  # a demoted primary's connection is given back: the pool's check discards it
    pgconn = conn.pgconn
    if poller is None:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
    if not poller.poll(0):
        return True
    conn.close()
    return False


def _put_back(pool: psycopg_pool.ConnectionPool, conn: Connection, poller: select.poll) -> None:
    """Return a pinned connection to the pool, closed first if the server ended it while it was pinned.
    The pool checks only the connections it holds (after an outage, for one); a pinned one is not among
    them, and one whose server's last words sit unread in its socket looks open: the pool would hand it
    out, and its next user would fail with those words."""
    if not conn.closed and not _alive(conn, poller):
        conn.close()
    pool.putconn(conn)  # a closed connection is discarded, and replaced when needed


def _give_back(pool: psycopg_pool.ConnectionPool, pin: Pin, held: set[Pin], lock: threading.Lock) -> None:
    """The pinning thread ended (or the process exits): return its connection to the pool."""
    if pin.pid != os.getpid():
        # Inherited through a fork: the connection is the parent's, and closing it here would end the
        # parent's session.
        return
    with pin.lock:
        poller = pin.poller
        conn = pin.drop()
        with lock:
            held.discard(pin)
    if conn is not None:
        _put_back(pool, conn, poller)

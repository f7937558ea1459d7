"""Reading one's own writes: waiting until a projection has applied the log up to a cursor.

A writer appends, gets its events' cursors, and wants its next read of a projection's tables to show
what it wrote. `wait_for` returns once the projection has passed the cursor:

* its durable cursor has reached it: a projection's table changes commit with its cursor, so its tables
  then show every event up to the cursor; or
* nothing the projection reads lies between its durable cursor and the wanted one. A projection that
  does not read the written types writes its cursor only when it applies something, so its cursor alone
  would never pass such a write. The check reads the log from the projection's cursor with the
  projection's types, gap-free: it answers yes only once every transaction up to the write has ended.

It does not poll in a loop: it listens on the channel that every cursor advance notifies when its batch
commits (migration 0017), and looks again when its projection's name arrives. Between notifications it
looks again every `_RECHECK` seconds, for the one change no notification announces: an older open
transaction ending, which lets the log's horizon pass the write. Lives in `projector` rather than on the
store, because only the projector knows projections, their cursors and the types they read; the store
stays below it (`eventstore` imports nothing of `projector`).

A waiter here holds a thread and a listening connection for as long as it waits: right for one caller
waiting for itself (a script, a node), wrong for a server that many tenants' reads wait on. A server's waits
go through `listener.ProjectionWaiters` (one listener for all, capped per tenant), which shares `reach`
with this module; see there why both exist.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from eventstore import START, AppendResult, Cursor, EventStore, InvalidInputError, LedgerflowError
from eventstore.spi import connect, load_queries, wrap_exceptions
from projector import cursor_rows
from projector.projection import Projection

log = structlog.get_logger(__name__)
Q = load_queries("projector", "waiting.sql")

#: How often a waiter looks again without a notification (for a horizon held back by an older transaction).
_RECHECK = 0.25
_CONNECT_TIMEOUT = 5
#: How long a waiter's listening connection is kept for the next wait (see `_Listeners`).
_KEEP_IDLE = 10.0


class ProjectionBehindError(LedgerflowError, TimeoutError):
    """The projection did not pass the wanted cursor within the time given. Nothing is wrong with the
    write; the projection's tables do not show it yet."""

    code = "projection_behind"

    def __init__(self, projection: str, position: Cursor | None, wanted: Cursor, timeout: float) -> None:
        self.projection, self.position, self.wanted, self.timeout = projection, position, wanted, timeout
        where = f"is at {position}" if position is not None else "has not run yet"
        super().__init__(
            f"projection {projection!r} {where}, not yet past {wanted}, after waiting {timeout:g}s; "
            "ask again, or see whether a projector runs it and whether it is blocked "
            "(`ledgerflow projections status`, `ledgerflow failures list`)"
        )

    def details(self) -> dict[str, Any]:
        return {
            "projection": self.projection,
            "position": None if self.position is None else str(self.position),
            "min_cursor": str(self.wanted),
            "timeout": self.timeout,
        }


def cursor_of(written: Cursor | AppendResult) -> Cursor:
    """The cursor a reader must pass to see `written`: its own, or an append's last event's."""
    if isinstance(written, Cursor):
        return written
    if isinstance(written, AppendResult) and written.events:
        return max(Cursor(e.transaction_id, e.position) for e in written.events)
    raise InvalidInputError(f"wait for a Cursor or an AppendResult with events, not {written!r}")


@dataclass(frozen=True, slots=True)
class Reach:
    """How far a projection's tables show the log, read once for any number of wanted cursors."""

    #: The projection's durable cursor (None before it first ran).
    at: Cursor | None
    #: The first event after `at` that the projection reads (None: none is readable yet).
    next_read: Cursor | None = None
    #: With no such event: how far the log is readable, gap-free (None when unknown).
    horizon: Cursor | None = None
    #: Of a partitioned projection: each segment's reach (`at` is then the lowest segment cursor).
    parts: tuple[Reach, ...] = ()

    def passed(self, wanted: Cursor) -> bool:
        if self.parts:
            return all(part.passed(wanted) for part in self.parts)
        if self.at is None:
            return False
        if self.at >= wanted:
            return True
        # Nothing the projection reads lies between its cursor and the wanted one.
        if self.next_read is not None:
            return wanted < self.next_read
        return self.horizon is not None and self.horizon >= wanted


def reach(store: EventStore, projection: Projection, conn: psycopg.Connection[Any]) -> Reach:
    """How far `projection`'s tables show the log: its durable cursor and the next event it would read
    (or the readable horizon when there is none)."""
    current = cursor_rows.get_cursor(conn, projection.name)
    if current is None:
        return Reach(None)
    if projection.partitions > 1 and current.partitions == projection.partitions:
        # A segment reads only its streams, so like a projection of few types, its cursor stays where it
        # last applied something while other segments' events go by.
        segments = cursor_rows.segment_cursors(conn, projection.name)
        parts = tuple(
            _reach_from(store, projection, at, conn, (k, projection.partitions))
            for k, at in sorted(segments.items())
        )
        if parts:
            return Reach(min(segments.values()), parts=parts)
    return _reach_from(store, projection, current.cursor, conn, None)


def _reach_from(
    store: EventStore,
    projection: Projection,
    at: Cursor,
    conn: psycopg.Connection[Any],
    segment: tuple[int, int] | None,
) -> Reach:
    # A projection whose cursor row says it applied everything up to `at` shows the log up to the
    # readable horizon when no event it reads lies between. Its cursor row does not follow that horizon
    # while it is idle (a write per idle poll): any transaction of the cluster that takes an id without
    # appending here moves `committed_so_far()` past it. So every projection is read from its cursor,
    # those of every event type too.
    page = store.read_all(at, limit=1, types=projection.event_types, conn=conn, segment=segment)
    if page.events:
        return Reach(at, next_read=page.events[0].cursor)
    return Reach(at, horizon=page.cursor if page.caught_up else None)


def passed(
    store: EventStore, projection: Projection, wanted: Cursor, conn: psycopg.Connection[Any]
) -> tuple[Cursor | None, bool]:
    """The projection's durable cursor (None before it first ran), and whether it has passed `wanted`."""
    found = reach(store, projection, conn)
    return found.at, found.passed(wanted)


def wait_for(
    store: EventStore, projection: Projection, written: Cursor | AppendResult, *, timeout: float = 10.0
) -> Cursor:
    """Wait until `projection` has passed `written` (a cursor, or an append's result); return the
    projection's cursor then. Raises ProjectionBehindError after `timeout` seconds (0: look once; its
    `position` is None while no projector has ever run the projection), InvalidInputError for a cursor
    beyond every committed write."""
    wanted = cursor_of(written)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise InvalidInputError(f"timeout {timeout!r} is invalid: use a number of seconds")
    if timeout < 0:
        raise InvalidInputError(f"timeout {timeout!r} is invalid: it must not be negative")
    if wanted == START:
        return wanted
    deadline = time.monotonic() + timeout
    with wrap_exceptions():
        with store.pool.connection() as conn:
            at, done = passed(store, projection, wanted, conn)
        if done:
            return at or wanted
        # Before any answer about the projection: a cursor no write returned is the caller's mistake,
        # whatever state the projection is in. "Committed so far" is itself a cursor callers are given
        # (an existing run's start answers with it), and it stays where it is until a transaction
        # begins: only a cursor past it lies beyond every committed write.
        if wanted.transaction_id > store.committed_so_far().transaction_id:
            raise InvalidInputError(
                f"cursor {wanted} lies beyond every committed write; use the cursor an append returned"
            )
        if timeout == 0:
            raise ProjectionBehindError(projection.name, at, wanted, timeout)
        # Behind: listen first, then look again, so that no advance falls between the look and the wait.
        with _listening(store) as listener:
            while True:
                at, done = passed(store, projection, wanted, listener)
                if done:
                    return at or wanted
                left = deadline - time.monotonic()
                if left <= 0:
                    log.info("projection_wait_timed_out", projection=projection.name, wanted=str(wanted))
                    raise ProjectionBehindError(projection.name, at, wanted, timeout)
                _next_advance(listener, projection.name, min(left, _RECHECK))


class _Listeners:
    """A store's connections for waiters, kept between waits (a connection costs more than a short wait
    itself) for up to `keep_for` seconds, then closed: a caller that waited once does not keep server
    slots for ever (`eventstore.pooling` does the same for the pool). All are closed when the store goes.
    An idle one listens to nothing (UNLISTEN when it comes back), so no notification piles up for it."""

    def __init__(self, url: str, keep: int = 8, keep_for: float = _KEEP_IDLE) -> None:
        self._url = url
        self._keep = keep
        self._keep_for = keep_for
        #: Idle connections and when each went idle, the latest last (taken first).
        self._idle: list[tuple[psycopg.Connection[Any], float]] = []
        self._lock = threading.Lock()
        self._sweep_due = False

    @contextmanager
    def listening(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            conn = self._idle.pop()[0] if self._idle else None
        if conn is None or conn.closed:
            conn = connect(
                self._url,
                autocommit=True,
                application_name="ledgerflow-waiter",
                connect_timeout=_CONNECT_TIMEOUT,
            )
        try:
            conn.execute(Q["listen_projections"])
            yield conn
            conn.execute(Q["unlisten_projections"])
            for _ in conn.notifies(timeout=0):
                pass  # what arrived before the UNLISTEN
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append((conn, time.monotonic()))
                self._sweep_later()
                return
        conn.close()

    def _sweep_later(self) -> None:
        """Close the idle connections once they have been idle `keep_for` (called with `_lock` held)."""
        if self._sweep_due or not self._idle:
            return
        self._sweep_due = True
        delay = max(0.0, self._idle[0][1] + self._keep_for - time.monotonic())
        timer = threading.Timer(delay, self._sweep)
        timer.daemon = True
        timer.start()

    def _sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._sweep_due = False
            expired = [conn for conn, since in self._idle if now - since >= self._keep_for]
            self._idle[:] = [(conn, since) for conn, since in self._idle if now - since < self._keep_for]
            self._sweep_later()
        for conn in expired:
            conn.close()

    @staticmethod
    def close(idle: list[tuple[psycopg.Connection[Any], float]]) -> None:
        for conn, _ in idle:
            conn.close()


_LISTENERS: weakref.WeakKeyDictionary[EventStore, _Listeners] = weakref.WeakKeyDictionary()
_LISTENERS_LOCK = threading.Lock()


def _listening(store: EventStore) -> AbstractContextManager[psycopg.Connection[Any]]:
    with _LISTENERS_LOCK:
        listeners = _LISTENERS.get(store)
        if listeners is None:
            listeners = _LISTENERS[store] = _Listeners(store.url)
            weakref.finalize(store, _Listeners.close, listeners._idle)
    return listeners.listening()


def _next_advance(listener: psycopg.Connection[Any], name: str, timeout: float) -> None:
    """Until `name`'s cursor advances (or `timeout`): other projections' advances are skipped."""
    until = time.monotonic() + timeout
    while (left := until - time.monotonic()) > 0:
        for note in listener.notifies(timeout=left, stop_after=1):
            if note.payload == name:
                return

"""How an append is sent: one path for every append statement (`eventstore.append_statements`).

The connection is chosen once per append (`AppendConnection`): the caller's (`conn=`, inside its own
transaction), else this thread's pinned one (`eventstore.pinning`), else one checked out of the pool for
the call. Then the same steps run whatever was chosen: send the statement (through libpq directly when a
pinned connection and the statement allow it, `eventstore.direct`), check the expected version once, wake
subscribers when the append committed on its own, and count the result.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool
import structlog

from eventstore import direct, telemetry
from eventstore.append_statements import AppendStatement
from eventstore.db import synced, translate
from eventstore.errors import ConflictError, LedgerflowError, WrongExpectedVersionError
from eventstore.events import AppendedEvent, AppendResult, ExpectedState, ExpectedVersion
from eventstore.notify import Notifier
from eventstore.partitions import ensure_partitions
from eventstore.pinning import Pin, PinnedConnections
from eventstore.rows import fetch_value
from eventstore.sqlfile import load_queries

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

log = structlog.get_logger(__name__)
Q = load_queries("eventstore")
#: Appends between two attempts to create the next partition after one failed.
_ROOM_RETRY_AFTER = 1000
#: Sends of one append that ran past the last partition, the partitions it needs created before each.
_PARTITION_ATTEMPTS = 4

Executor = psycopg.Connection[Any] | psycopg.Cursor[Any]


class AppendConnection:
    """The connection one append runs on, chosen when entered (see the module's documentation), and the
    append's database boundary: a driver error raised while it is chosen, held or given back comes out
    as a LedgerflowError (`eventstore.db.translate`, the driver's error as its `__cause__`)."""

    __slots__ = ("_checkout", "_pins", "_pool", "executor", "pin")

    def __init__(
        self,
        conn: psycopg.Connection[Any] | None,
        pins: PinnedConnections,
        pool: psycopg_pool.ConnectionPool,
    ) -> None:
        #: What runs the statements: the caller's connection, the pin's cursor, or the checked-out one.
        self.executor: Executor | None = conn
        self.pin: Pin | None = None
        self._pins = pins
        self._pool = pool
        self._checkout: AbstractContextManager[psycopg.Connection[Any]] | None = None

    def __enter__(self) -> AppendConnection:
        if self.executor is not None:
            return self  # the caller's
        try:
            pin = self._pins.acquire()
            if pin is not None:
                self.pin, self.executor = pin, pin.cursor  # the cursor is made with the connection
                return self
            self._checkout = self._pool.connection()
            self.executor = self._checkout.__enter__()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self.pin is not None:
                self._pins.release()
            elif self._checkout is not None:
                self._checkout.__exit__(kind, exc, tb)
        except psycopg.Error as failed:
            raise translate(failed) from failed
        if isinstance(exc, psycopg.Error):
            raise translate(exc) from exc


class AppendPath:
    """The sending of append statements, for `EventStore` (whose attributes these are)."""

    pool: psycopg_pool.ConnectionPool
    _pins: PinnedConnections
    _notifier: Notifier | None
    _log_end: int
    _partition_size: int
    _room_lock: threading.Lock
    _room_keeper: threading.Thread | None

    def _write(self, statement: AppendStatement, conn: psycopg.Connection[Any] | None) -> AppendResult:
        """Send an append, in a span when traced. Should its positions run past the last partition (a batch
        wider than the partition kept ahead), the partitions it needs are created and it is sent again, a
        few times at most: appenders racing past narrow partitions take positions (a failed INSERT takes
        one too) between the creation and the next attempt. Appends in the caller's transaction (`conn=`)
        cannot be sent again: the error reaches the caller."""
        with telemetry.span_if_traced(
            telemetry.tracer,
            "ledgerflow.append",
            lambda: {
                "ledgerflow.tenant": statement.tenant,
                "ledgerflow.streams": statement.streams,
                "ledgerflow.events": statement.events,
            },
        ):
            for attempt in range(_PARTITION_ATTEMPTS - 1):
                try:
                    return self._send(statement, conn)
                except LedgerflowError as exc:
                    if conn is not None or not _no_partition(exc):
                        raise
                with self.pool.connection() as own:
                    end = ensure_partitions(own)
                    # Twice the room at each attempt, for the positions others take meanwhile.
                    room = (end.partition_size + statement.events) << attempt
                    ensure_partitions(own, headroom=room)
            return self._send(statement, conn)

    def _send(self, statement: AppendStatement, conn: psycopg.Connection[Any] | None) -> AppendResult:
        """The one append path: the connection chosen once, the statement sent, the version checked."""
        began = time.perf_counter()
        try:
            with AppendConnection(conn, self._pins, self.pool) as chosen:
                pin, executor = chosen.pin, chosen.executor
                assert executor is not None
                if pin is not None and pin.direct and statement.direct_form is not None:
                    assert pin.conn is not None
                    rows: list[Any] = [
                        (r[0].decode(), int(r[1]), int(r[2]), int(r[3]))  # type: ignore[union-attr,arg-type]
                        for r in direct.execute(
                            pin.conn, pin.prepared, statement.direct_form, statement.params
                        )
                    ]
                else:
                    rows = synced(executor.execute(statement.query, statement.params)).fetchall()
                if not rows and statement.missing is not None:
                    _wrong_version(executor, statement.tenant, *statement.missing)
            if conn is None:
                self.notify_appended()
        except ConflictError as exc:
            telemetry.append_conflicts.add(1, {"reason": exc.code})
            raise
        return self.appended(rows, statement.tenant, began)

    def statement_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A connection for one autocommit statement that appends, such as a workflow's start or a node's
        end: this thread's pinned connection, as the one-event append uses (see `eventstore.pinning`), or
        one checked out of the pool for the call. Nothing may be left open on it: no transaction, no
        session setting."""
        return self._pins.connection()

    def appended(self, rows: list[Any], tenant: str, began: float) -> AppendResult:
        """The result of an append statement from its rows (stream, version, position, transaction id
        and, for `append_events`, duplicate), with what every append does after it: room made ahead in
        the log, the append counted. `began`: its `time.perf_counter()` before it was sent. For callers
        that send the append in a statement of their own (see `one_stream_params`)."""
        if len(rows) > 1:
            rows.sort(key=lambda r: r[2])  # by position
        if rows:
            self._make_room(int(rows[-1][2]))
        result = AppendResult(
            events=tuple(AppendedEvent(r[0], r[1], r[2], r[3]) for r in rows),
            duplicate=bool(rows and len(rows[0]) > 4 and rows[0][4]),
        )
        telemetry.append_latency.record((time.perf_counter() - began) * 1000, {"tenant": tenant})
        if not result.duplicate:
            telemetry.events_appended.add(len(result.events), {"tenant": tenant})
        return result

    def _make_room(self, position: int) -> None:
        """Once appends reach the log's last partition, have the next one created: by a thread of its own,
        one statement per partition and process, never on the append's round trip nor holding up its
        caller. (An appender inside its own transaction holds a pool connection: waiting here for a second
        one could wait for the whole pool.) The partition kept ahead gives that thread a whole partition of
        room; an append that outruns it anyway creates what it needs itself (`_write`)."""
        if position < self._log_end - self._partition_size:
            return
        with self._room_lock:
            if self._room_keeper is not None and self._room_keeper.is_alive():
                return
            self._room_keeper = threading.Thread(
                target=self._keep_room, args=(position,), name="ledgerflow-log-room", daemon=True
            )
            self._room_keeper.start()

    def _keep_room(self, position: int) -> None:
        try:
            with self.pool.connection() as conn:
                end = ensure_partitions(conn)
        except (LedgerflowError, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            # Tried again after some more appends; the partition ahead still has a whole partition's room.
            log.warning("log_partition_not_created", error=str(exc))
            self._log_end, self._partition_size = position + _ROOM_RETRY_AFTER, 0
            return
        self._log_end, self._partition_size = end.end, end.partition_size

    def notify_appended(self) -> None:
        """Wake subscribers. Called after an append commits; callers that append inside their own
        transaction (`conn=`) call it after their commit."""
        if self._notifier is not None:
            self._notifier.poke()


def _no_partition(exc: LedgerflowError) -> bool:
    """Whether an append failed for want of a partition for its positions."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.errors.CheckViolation) and "no partition" in str(cause)


def _wrong_version(executor: Executor, tenant: str, stream_id: str, expected: ExpectedVersion) -> None:
    """A single-stream statement inserted nothing: the expected version does not hold; say which it is."""
    conn = executor if isinstance(executor, psycopg.Connection) else executor.connection
    version = fetch_value(conn, Q["stream_version"], {"tenant": tenant, "stream_id": stream_id})
    raise WrongExpectedVersionError(tenant, stream_id, _describe(expected), version)


def _describe(expected: ExpectedVersion) -> str:
    if isinstance(expected, ExpectedState):
        return expected.name.lower().replace("_", " ")
    return f"version {expected}"

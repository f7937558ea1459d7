"""Reading the event log: one stream, several, a stream page, the global log gap-free, and the safe
horizon. For `EventStore`, whose read methods these are; every read's events pass through `_shaped` or
`_shaped_encoded`, and nowhere else do reads change an event's shape."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

from eventstore import _validation as check
from eventstore import jsonvalue
from eventstore.db import wrap_exceptions
from eventstore.errors import InvalidInputError
from eventstore.event_rows import EventRow, LogRow, checked_rows
from eventstore.events import (
    START,
    Cursor,
    EncodedEvent,
    EncodedPage,
    ReadPage,
    RecordedEvent,
    StreamPage,
)
from eventstore.eventtypes import EventTypes
from eventstore.jsonvalue import loads
from eventstore.personal import Shredder
from eventstore.rows import Query, fetch_all, fetch_one, fetch_value, fetch_values
from eventstore.sqlfile import load_queries

Q = load_queries("eventstore")
DEFAULT_TENANT = "default"
_FORWARD_FROM_START = 1
_END = 2**62


@dataclass(frozen=True, slots=True)
class HorizonHolder:
    """A transaction holding the safe horizon back, a writer of the log (see `Horizon`): readers of the
    global log wait for it to finish. A prepared transaction shows as pid 0."""

    pid: int
    application: str
    database: str
    state: str
    transaction_id: int
    started_at: datetime | None
    age_seconds: float
    query: str


@dataclass(frozen=True, slots=True)
class Horizon:
    """The log's safe horizon: readers see every event whose `transaction_id` is below `xmin`.

    Only writers of the log hold it back: transactions that append, or appended, to this database's log
    and are still running (migration 0013). Transactions that do not write to the log, in this database
    or any other of the server, never do.
    """

    xmin: int
    head_position: int
    #: Committed events not yet readable because an older transaction is still running.
    waiting_events: int
    holders: tuple[HorizonHolder, ...] = ()

    @property
    def age_seconds(self) -> float:
        return max((h.age_seconds for h in self.holders), default=0.0)


def _encoded(row: Sequence[Any]) -> EncodedEvent:
    """An event from a read's row in `EventRow`'s order: its running page size, then the event's
    columns."""
    if type(row[8]) is dict:  # revealed personal fields, decoded (eventstore.personal)
        columns = list(row[1:])
        columns[7] = jsonvalue.dumps(row[8])
        return EncodedEvent(*columns)
    return EncodedEvent(*row[1:])


def _recorded(row: Sequence[Any], types: EventTypes | None = None) -> RecordedEvent:
    """`_encoded(row).decode()`, without the intermediate object; in its type's latest shape when given
    `types` (built once either way)."""
    # In `EventRow`'s order, which `checked_rows` held the statement to; unpacked at once, the cheapest
    # way through thousands of rows.
    _, position, tx, tenant, stream_id, version, event_id, type_, data, metadata, corr, cause, at = row
    decoded = loads(data) if type(data) is str else data  # a dict: revealed personal fields
    meta = loads(metadata)
    if types is not None and types.may_upcast(type_, meta):
        parts = types.latest_parts(
            type_,
            decoded,
            meta,
            lambda: RecordedEvent(
                position, tx, tenant, stream_id, version, event_id, type_, decoded, meta, corr, cause, at
            ),
        )
        if parts is not None:
            decoded, meta = parts
    return RecordedEvent(
        position, tx, tenant, stream_id, version, event_id, type_, decoded, meta, corr, cause, at
    )


class LogReading:
    """The reads of the log, for `EventStore` (whose attributes these are)."""

    pool: psycopg_pool.ConnectionPool
    types: EventTypes
    personal: Shredder
    max_page_bytes: int

    @staticmethod
    def recorded(rows: Iterable[Sequence[Any]]) -> list[RecordedEvent]:
        """Events from rows in `EventRow`'s order, for a statement of its own that also reads a stream
        (see ledgerflow.wf_record_run_end)."""
        return [_recorded(r) for r in rows]

    def read_stream(
        self,
        stream_id: str,
        *,
        tenant: str = DEFAULT_TENANT,
        from_version: int | None = None,
        backward: bool = False,
        limit: int = 1000,
        upcast: bool = True,
    ) -> list[RecordedEvent]:
        """A stream's events from `from_version` (inclusive), oldest first or, `backward`, newest first:
        `limit` of them, or all up to the stream's end. For pages bounded by size, see `read_stream_page`.
        Events come in their type's latest shape unless `upcast=False` (see `eventstore.eventtypes`)."""
        check.check_tenant(tenant)
        check.check_stream_id(stream_id)
        _check_limit(limit)
        version = from_version if from_version is not None else (_END if backward else _FORWARD_FROM_START)
        query = Q["read_stream_backward"] if backward else Q["read_stream_forward"]
        with wrap_exceptions(), self.pool.connection() as conn:
            params = {"tenant": tenant, "stream_id": stream_id, "version": version, "limit": limit}
            rows = self.personal.reveal(conn, _events(conn, query, params), 0)
        return self._shaped(rows, upcast)

    def read_stream_page(
        self,
        stream_id: str,
        *,
        tenant: str = DEFAULT_TENANT,
        from_version: int | None = None,
        backward: bool = False,
        limit: int = 1000,
        max_bytes: int | None = None,
        upcast: bool = False,
    ) -> StreamPage:
        """A page of a stream from `from_version` (inclusive): at most `limit` events, and it stops once
        their size passes `max_bytes` (default: the store's `max_page_bytes`), always with at least one
        event. The events stay JSON text (stored shape, unless `upcast`); continue from the page's
        `next_version`."""
        check.check_tenant(tenant)
        check.check_stream_id(stream_id)
        _check_limit(limit)
        budget = self._budget(max_bytes)
        if from_version is None:
            from_version = _END if backward else _FORWARD_FROM_START
        params = {
            "tenant": tenant,
            "stream_id": stream_id,
            # The walk starts just outside the first version it may take.
            "version": from_version + 1 if backward else from_version - 1,
            "limit": limit,
            "max_bytes": budget,
        }
        with wrap_exceptions(), self.pool.connection() as conn:
            rows = self.personal.reveal(conn, _events(conn, _STREAM_PAGE[backward], params), 0)
        events = self._shaped_encoded(tuple(_encoded(r) for r in rows), upcast)
        if not events or (len(events) < limit and EventRow._make(rows[-1]).bytes < budget):
            return StreamPage(events, None)
        last = events[-1].stream_version
        following = last - 1 if backward else last + 1
        return StreamPage(events, following if following >= 1 else None)

    def read_streams(
        self, stream_ids: Sequence[str], *, tenant: str = DEFAULT_TENANT, upcast: bool = True
    ) -> dict[str, list[RecordedEvent]]:
        """Several whole streams at once, each oldest first; absent streams map to no events."""
        check.check_tenant(tenant)
        for stream_id in stream_ids:
            check.check_stream_id(stream_id)
        found: dict[str, list[RecordedEvent]] = {s: [] for s in stream_ids}
        with wrap_exceptions(), self.pool.connection() as conn:
            params = {"tenant": tenant, "stream_ids": list(stream_ids)}
            rows = self.personal.reveal(conn, _events(conn, Q["read_streams"], params), 0)
        for event in self._shaped(rows, upcast):
            found[event.stream_id].append(event)
        return found

    def stream_version(self, stream_id: str, *, tenant: str = DEFAULT_TENANT) -> int | None:
        """The version of the stream's last event, or None if the stream does not exist."""
        check.check_tenant(tenant)
        check.check_stream_id(stream_id)
        with wrap_exceptions(), self.pool.connection() as conn:
            version: int | None = fetch_value(
                conn, Q["stream_version"], {"tenant": tenant, "stream_id": stream_id}
            )
        return version

    def idempotency_key_used(self, idempotency_key: str, *, tenant: str = DEFAULT_TENANT) -> bool:
        """Whether a committed append used `idempotency_key` (whatever its content): a read, nothing is
        written or locked. An append under the key still in flight is not seen; its repeat meets it."""
        check.check_tenant(tenant)
        check.check_idempotency_key(idempotency_key)
        with wrap_exceptions(), self.pool.connection() as conn:
            row = conn.execute(
                Q["idempotency_key_used"], {"tenant": tenant, "idempotency_key": idempotency_key}
            ).fetchone()
        return row is not None

    def idempotency_keys_used(self, keys: Sequence[str], *, tenant: str = DEFAULT_TENANT) -> set[str]:
        """Which of `keys` a committed append used: `idempotency_key_used` for many keys in one read."""
        check.check_tenant(tenant)
        for key in keys:
            check.check_idempotency_key(key)
        with wrap_exceptions(), self.pool.connection() as conn:
            return set(fetch_values(conn, Q["idempotency_keys_used"], {"tenant": tenant, "keys": list(keys)}))

    def read_all(
        self,
        after: Cursor = START,
        *,
        limit: int = 1000,
        tenant: str | None = None,
        types: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
        max_bytes: int | None = None,
        conn: psycopg.Connection[Any] | None = None,
        upcast: bool = True,
        segment: tuple[int, int] | None = None,
    ) -> ReadPage:
        """The next events of the global log after `after`, in resume order, gap-free.

        A reader that always resumes from the returned cursor sees every committed event exactly once,
        however many writers commit out of order. `tenant=None` reads every tenant (internal use). A page
        holds at most `limit` events and stops once their size passes `max_bytes` (default: the store's
        `max_page_bytes`), always with at least one event; such a page is not `caught_up`. A page may
        also be empty and not `caught_up`: the transaction at the horizon ended while it was read, so more
        may be readable at once. Events come in their type's latest shape unless `upcast=False`.
        `segment=(k, n)` reads only the streams whose segment of `n` is `k` (migration 0065).
        """
        rows, cursor, caught_up = self._read_all(
            after, limit, tenant, types, categories, max_bytes, conn, segment
        )
        return ReadPage(tuple(self._shaped((r[_LOG_EVENT:] for r in rows), upcast)), cursor, caught_up)

    def read_all_encoded(
        self,
        after: Cursor = START,
        *,
        limit: int = 1000,
        tenant: str | None = None,
        types: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
        max_bytes: int | None = None,
        conn: psycopg.Connection[Any] | None = None,
        upcast: bool = False,
    ) -> EncodedPage:
        """`read_all`, with each event's data and metadata left as JSON text (stored shape, unless
        `upcast`)."""
        rows, cursor, caught_up = self._read_all(after, limit, tenant, types, categories, max_bytes, conn)
        events = self._shaped_encoded(tuple(_encoded(r[_LOG_EVENT:]) for r in rows), upcast)
        return EncodedPage(events, cursor, caught_up)

    def _read_all(
        self,
        after: Cursor,
        limit: int,
        tenant: str | None,
        types: Sequence[str] | None,
        categories: Sequence[str] | None,
        max_bytes: int | None,
        conn: psycopg.Connection[Any] | None,
        segment: tuple[int, int] | None = None,
    ) -> tuple[list[Any], Cursor, bool]:
        """The page's event rows (in `LogRow`'s order), where to resume, and whether the reader is caught
        up."""
        if tenant is not None:
            check.check_tenant(tenant)
        _check_limit(limit)
        budget = self._budget(max_bytes)
        params = {
            "transaction_id": str(after.transaction_id),
            "position": after.position,
            "tenant": tenant,
            "types": list(types) if types is not None else None,
            "categories": list(categories) if categories is not None else None,
            "limit": limit,
            "max_bytes": budget,
            "segment": None if segment is None else segment[0],
            "partitions": None if segment is None else segment[1],
        }
        with wrap_exceptions(), self._connection(conn) as c:
            with c.cursor(row_factory=_LOG_ROWS) as cur:
                rows = cur.execute(Q["read_all"], params).fetchall()
            first = LogRow._make(rows[0])
            xmin, ended = first.xmin, first.ended
            rows = [] if first.position is None else self.personal.reveal(c, rows, _LOG_EVENT)
        last = LogRow._make(rows[-1]) if rows else None
        if last is not None and (len(rows) == limit or last.bytes >= budget):
            # Stopped at the count or the byte budget: more may follow at once.
            return rows, Cursor(last.transaction_id, last.position), False
        # Everything below the horizon that matches has been read: resume at the horizon. If the
        # transaction it stopped at has ended meanwhile, more may be readable at once.
        return rows, max(after, Cursor(xmin, 0)), not ended

    # Every read's events pass through these two, and nowhere else do reads change an event's shape.
    def _shaped(self, rows: Iterable[Sequence[Any]], upcast: bool) -> list[RecordedEvent]:
        """The events of a read's rows (see `_recorded`): in their type's latest shape when `upcast`."""
        types = self.types if upcast else None
        return [_recorded(r, types) for r in rows]

    def _shaped_encoded(self, events: tuple[EncodedEvent, ...], upcast: bool) -> tuple[EncodedEvent, ...]:
        """`_shaped` for events kept as JSON text: only events that change are decoded and encoded."""
        if not upcast:
            return events
        upcast_one = self.types.upcast_encoded
        return tuple(upcast_one(e) for e in events)

    def _budget(self, max_bytes: int | None) -> int:
        if max_bytes is None:
            return self.max_page_bytes
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidInputError(f"max_bytes {max_bytes!r} is invalid: use a positive number of bytes")
        return max_bytes

    def horizon(self, *, holders: int = 5) -> Horizon:
        """The safe horizon, and which writers of the log hold it back (pid, application, age)."""
        with wrap_exceptions(), self.pool.connection() as conn:
            found = fetch_one(conn, Horizon, Q["horizon"])
            held = fetch_all(conn, HorizonHolder, Q["horizon_holders"], {"limit": holders})
        assert found is not None  # the statement answers one row
        return dataclasses.replace(found, holders=tuple(held))

    def committed_so_far(self) -> Cursor:
        """A cursor that every event committed before this call lies below: a reader whose cursor reaches
        it has seen all of them (used to wait for a reader to catch up with "now")."""
        with wrap_exceptions(), self.pool.connection() as conn:
            xmax = fetch_value(conn, Q["snapshot_xmax"])
        return Cursor(int(xmax), 0)

    def events_beyond_horizon(self) -> bool:
        """True when committed events wait for an older writer of the log to finish before they can be
        read."""
        with wrap_exceptions(), self.pool.connection() as conn:
            return bool(fetch_value(conn, Q["events_beyond_horizon"]))

    @contextmanager
    def _connection(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        if conn is not None:
            yield conn
        else:
            with self.pool.connection() as own:
                yield own


_EVENT_ROWS = checked_rows(EventRow)
_LOG_ROWS = checked_rows(LogRow)
#: Where a `LogRow`'s `EventRow` begins: its horizon columns come first.
_LOG_EVENT = len(LogRow._fields) - len(EventRow._fields)


def _events(conn: psycopg.Connection[Any], query: Query, params: dict[str, Any]) -> list[Any]:
    """The rows of a stream read, in `EventRow`'s order."""
    with conn.cursor(row_factory=_EVENT_ROWS) as cur:
        return cur.execute(query, params).fetchall()


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InvalidInputError(f"limit {limit!r} is invalid: use 1 to 100000")


#: The stream page query for each direction (key: backward).
_STREAM_PAGE = {
    backward: sql.SQL(Q["read_stream_page"]).format(next=sql.SQL(Q[name]))
    for backward, name in ((False, "next_forward"), (True, "next_backward"))
}

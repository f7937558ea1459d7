"""Appending to and reading from the event log. The only module of `eventstore` that runs log SQL."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
import psycopg_pool
import pydantic
import structlog
from psycopg import sql

from eventstore import _validation as check
from eventstore import direct, jsonvalue, telemetry
from eventstore.arrays import BigintArray, IntArray, TextArray, UuidArray
from eventstore.db import synced, wrap_exceptions
from eventstore.errors import (
    ConflictError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    WrongExpectedVersionError,
)
from eventstore.events import (
    START,
    AppendedEvent,
    AppendResult,
    Cursor,
    EncodedEvent,
    EncodedPage,
    ExpectedState,
    ExpectedVersion,
    NewEvent,
    ReadPage,
    RecordedEvent,
    StreamAppend,
    StreamPage,
)
from eventstore.eventtypes import DEFAULT_TYPES, EventTypes
from eventstore.jsonvalue import loads
from eventstore.keys import SubjectKeys
from eventstore.masterkeys import MasterKeys
from eventstore.notify import Notifier
from eventstore.partitions import ensure_partitions
from eventstore.personal import Shredder
from eventstore.pinning import PinnedConnections
from eventstore.pooling import Pool
from eventstore.sqlfile import load_queries

if TYPE_CHECKING:
    from eventstore.subscribe import Subscription

log = structlog.get_logger(__name__)
Q = load_queries("eventstore")
#: Appends between two attempts to create the next partition after one failed.
_ROOM_RETRY_AFTER = 1000

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
    holders: tuple[HorizonHolder, ...]

    @property
    def age_seconds(self) -> float:
        return max((h.age_seconds for h in self.holders), default=0.0)


@dataclass(frozen=True, slots=True)
class _PreparedEvent:
    event: NewEvent
    data: str
    metadata: str


def _expected_code(expected: ExpectedVersion) -> int:
    if isinstance(expected, ExpectedState):
        return expected.value
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise InvalidInputError(
            f"expected version {expected!r} is invalid: stream versions start at 1; "
            "use NO_STREAM for a new stream"
        )
    return expected


def _encoded(row: Sequence[Any]) -> EncodedEvent:
    """An event from a read query's row: its running page size, then the event's columns in order."""
    if type(row[8]) is dict:  # revealed personal fields, decoded (eventstore.personal)
        columns = list(row[1:])
        columns[7] = jsonvalue.dumps(row[8])
        return EncodedEvent(*columns)
    return EncodedEvent(*row[1:])


def _recorded(row: Sequence[Any], types: EventTypes | None = None) -> RecordedEvent:
    """`_encoded(row).decode()`, without the intermediate object; in its type's latest shape when given
    `types` (built once either way)."""
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


class EventStore:
    """The append-only event log.

    Appends are single statements on autocommit connections: atomic, one round trip each. Reads of the
    global log are gap-free (see `read_all`).
    """

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        *,
        url: str | None = None,
        types: EventTypes | None = None,
        max_event_bytes: int = 1024 * 1024,
        max_events_per_append: int = 10_000,
        max_page_bytes: int = 4 * 1024 * 1024,
        notifier: Notifier | None = None,
        pinned_connections: int | None = None,
        master_keys: MasterKeys | None = None,
    ) -> None:
        self.pool = pool

        #: The database URL, for the dedicated connections that subscriptions LISTEN on.
        conninfo = pool.conninfo
        self.url = url or (conninfo if isinstance(conninfo, str) else conninfo())
        #: Declared event types and upcasters (default: those the module-level decorators declared).
        self.types = DEFAULT_TYPES if types is None else types
        self.types.check()
        self.max_event_bytes = max_event_bytes
        self.max_events_per_append = max_events_per_append
        #: A read page stops once its events pass this many bytes (always with at least one event).
        self.max_page_bytes = max_page_bytes
        self._notifier = notifier
        #: Appending threads keep a pool connection (see `eventstore.pinning`); by default up to half the
        #: pool, so that other work always finds connections.
        pinned = pool.max_size // 2 if pinned_connections is None else pinned_connections
        self._pins = PinnedConnections(pool, limit=min(pinned, pool.max_size))
        #: Personal fields: sealed at append, revealed or redacted at read (see `eventstore.personal`).
        self.personal = Shredder(SubjectKeys(pool, master_keys or MasterKeys(None), self._pins.connection))
        if isinstance(pool, Pool):
            pool.before_checkout = self._pins.give_back_idle  # no hold-and-wait (see eventstore.pooling)
            pool.reclaim_idle = self._pins.give_back_all_idle
        #: Where the log's last partition ends and how wide partitions are, as last seen (0: not yet).
        self._log_end = 0
        self._partition_size = 0
        self._room_lock = threading.Lock()
        self._room_keeper: threading.Thread | None = None

    def close(self) -> None:
        """Close the notifier and the pool (when the store was opened with `open_store`)."""
        if self._notifier is not None:
            self._notifier.close()
        self._pins.close()
        self.pool.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(self, after: Cursor = START, **options: Any) -> Subscription:
        """Follow the log from `after`; see `eventstore.subscribe.Subscription` for the options."""
        from eventstore.subscribe import Subscription

        return Subscription(self, self.url, after, **options)

    # -- appending -------------------------------------------------------------------------------

    def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent | pydantic.BaseModel],
        *,
        expected_version: ExpectedVersion = ExpectedState.ANY,
        idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT,
        conn: psycopg.Connection[Any] | None = None,
    ) -> AppendResult:
        """Append `events` to one stream atomically. See `append_many` for the guarantees."""
        if idempotency_key is None and type(events) in (list, tuple) and len(events) == 1:
            return self._append_one(stream_id, events[0], expected_version, tenant, conn)
        return self.append_many(
            [StreamAppend(stream_id, events, expected_version)],
            idempotency_key=idempotency_key,
            tenant=tenant,
            conn=conn,
        )

    def append_many(
        self,
        appends: Sequence[StreamAppend],
        *,
        idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT,
        conn: psycopg.Connection[Any] | None = None,
    ) -> AppendResult:
        """Append to several streams atomically: all events are written, or none.

        Each stream's expected version is checked; a mismatch raises WrongExpectedVersionError and
        writes nothing. With an idempotency key, a repeat of the same content returns the first
        append's result (`duplicate=True`) and writes nothing; other content under the same key raises
        IdempotencyConflictError. Pass `conn` to append inside the caller's transaction.
        """
        if idempotency_key is None and type(appends) in (list, tuple) and len(appends) == 1:
            one = appends[0]
            if isinstance(one, StreamAppend) and type(one.events) in (list, tuple) and len(one.events) == 1:
                return self._append_one(one.stream_id, one.events[0], one.expected_version, tenant, conn)
        params = self._append_params(appends, idempotency_key, tenant)
        query: LiteralString | bytes = Q["append"]
        missing: tuple[str, ExpectedVersion] | None = None
        if len(appends) == 1 and idempotency_key is None:
            query, params = _one_stream(appends[0], params)
            missing = (appends[0].stream_id, appends[0].expected_version)
        return self._write(query, params, tenant, len(appends), len(params["event_ids"]), conn, missing)

    def _append_one(
        self,
        stream_id: str,
        event: NewEvent | pydantic.BaseModel,
        expected: ExpectedVersion,
        tenant: str,
        conn: psycopg.Connection[Any] | None,
    ) -> AppendResult:
        """The most common append of all, one event to one stream without an idempotency key: the same
        checks in the same order as `append_many`, one plain statement with plain parameters."""
        check.check_tenant(tenant)
        check.check_stream_id(stream_id)
        p = self._prepare(event, tenant)
        new = p.event
        code = _expected_code(expected)
        params = {
            "tenant": tenant,
            "stream_id": stream_id,
            "count": 1,
            "expected": code if code > 0 else None,
            "event_id": new.event_id,
            "type": new.type,
            "one_data": p.data,
            "one_metadata": p.metadata,
            "correlation_id": new.correlation_id,
            "causation_id": new.causation_id,
        }
        key = _bump_key(expected)
        return self._write(
            _ONE_EVENT[key], params, tenant, 1, 1, conn, (stream_id, expected), _ONE_EVENT_DIRECT[key]
        )

    def _write(
        self,
        query: LiteralString | bytes,
        params: dict[str, Any],
        tenant: str,
        streams: int,
        events: int,
        conn: psycopg.Connection[Any] | None,
        missing: tuple[str, ExpectedVersion] | None,
        direct_form: direct.DirectStatement | None = None,
    ) -> AppendResult:
        """Run an append statement; `missing`: the stream and expectation of a single-stream statement,
        which writes no row (rather than raising) when the expected version does not hold;
        `direct_form`: the statement's form for `eventstore.direct`, if it has one."""
        if not telemetry.tracing():
            return self._write_in_room(query, params, tenant, events, conn, missing, direct_form)
        with telemetry.tracer.start_as_current_span(
            "ledgerflow.append",
            attributes={
                "ledgerflow.tenant": tenant,
                "ledgerflow.streams": streams,
                "ledgerflow.events": events,
            },
        ):
            return self._write_in_room(query, params, tenant, events, conn, missing, direct_form)

    def _write_in_room(
        self,
        query: LiteralString | bytes,
        params: dict[str, Any],
        tenant: str,
        events: int,
        conn: psycopg.Connection[Any] | None,
        missing: tuple[str, ExpectedVersion] | None,
        direct_form: direct.DirectStatement | None,
    ) -> AppendResult:
        """The append; should its positions run past the last partition (a batch wider than the
        partition kept ahead), the partitions it needs are created and it is sent again, once. Appends in
        the caller's transaction (`conn=`) cannot be sent again: the error reaches the caller."""
        try:
            return self._write_untraced(query, params, tenant, conn, missing, direct_form)
        except LedgerflowError as exc:
            if conn is not None or not _no_partition(exc):
                raise
        with self.pool.connection() as own:
            end = ensure_partitions(own)
            ensure_partitions(own, headroom=end.partition_size + events)
        return self._write_untraced(query, params, tenant, conn, missing, direct_form)

    def _write_untraced(
        self,
        query: LiteralString | bytes,
        params: dict[str, Any],
        tenant: str,
        conn: psycopg.Connection[Any] | None,
        missing: tuple[str, ExpectedVersion] | None,
        direct_form: direct.DirectStatement | None,
    ) -> AppendResult:
        began = time.perf_counter()
        try:
            with wrap_exceptions():
                if conn is not None:
                    rows = synced(conn.execute(query, params)).fetchall()
                    if not rows and missing is not None:
                        _wrong_version(conn, tenant, *missing)
                elif (pin := self._pins.acquire()) is not None:
                    try:
                        cursor, pinned = pin.cursor, pin.conn
                        assert cursor is not None
                        assert pinned is not None
                        if direct_form is not None and pin.direct:
                            rows = [
                                (r[0].decode(), int(r[1]), int(r[2]), int(r[3]))  # type: ignore[union-attr,arg-type]
                                for r in direct.execute(pinned, pin.prepared, direct_form, params)
                            ]
                        else:
                            rows = cursor.execute(query, params).fetchall()
                        if not rows and missing is not None:
                            _wrong_version(cursor, tenant, *missing)
                    finally:
                        self._pins.release()
                else:
                    with self.pool.connection() as own:
                        rows = own.execute(query, params).fetchall()
                        if not rows and missing is not None:
                            _wrong_version(own, tenant, *missing)
            if conn is None:
                self.notify_appended()
        except ConflictError as exc:
            telemetry.append_conflicts.add(1, {"reason": exc.code})
            raise
        return self.appended(rows, tenant, began)

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

    @staticmethod
    def recorded(rows: Iterable[Sequence[Any]]) -> list[RecordedEvent]:
        """Events from rows in a stream read's columns (see read_stream_forward in queries.sql), for a
        statement of its own that also reads a stream (see ledgerflow.wf_record_run_end)."""
        return [_recorded(r) for r in rows]

    def one_stream_params(
        self,
        stream_id: str,
        events: Sequence[NewEvent | pydantic.BaseModel],
        expected_version: ExpectedVersion,
        tenant: str,
    ) -> dict[str, Any]:
        """The parameters of an append of `events` to one stream expected at `expected_version`, checked
        as `append` checks them, for a statement that appends as `append_one_stream` does (in queries.sql)
        together with writes of its own, in one round trip (see ledgerflow.wf_record_node_end). Its rows
        go through `appended`; it does not wake subscribers: call `notify_appended` once it committed."""
        params = self._append_params([StreamAppend(stream_id, events, expected_version)], None, tenant)
        del params["idempotency_key"], params["request_hash"], params["stream_ids"], params["counts"]
        exact = isinstance(expected_version, int) and not isinstance(expected_version, bool)
        return {**params, "stream_id": stream_id, "expected": expected_version if exact else None}

    def _make_room(self, position: int) -> None:
        """Once appends reach the log's last partition, have the next one created: by a thread of its own,
        one statement per partition and process, never on the append's round trip nor holding up its
        caller. (An appender inside its own transaction holds a pool connection: waiting here for a second
        one could wait for the whole pool.) The partition kept ahead gives that thread a whole partition of
        room; an append that outruns it anyway creates what it needs itself (`_write_in_room`)."""
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

    def _prepare(self, event: NewEvent | pydantic.BaseModel, tenant: str) -> _PreparedEvent:
        # A model instance becomes its NewEvent; a declared type is validated and its version recorded.
        event = self.types.stamp(event)
        if not isinstance(event, NewEvent):
            raise InvalidInputError(f"events must be NewEvent instances, not {type(event).__name__}")
        check.check_event_type(event.type)
        # The stored data: personal fields sealed. `event` keeps the plain data for the idempotency hash,
        # so a retry hashes the same whatever the ciphertexts' random nonces.
        data, problem = check.dumped_json_object(self.personal.seal(tenant, event))
        if problem is not None:
            raise InvalidInputError(f"data of event {event.type!r} {problem}")
        metadata, problem = check.dumped_json_object(event.metadata)
        if problem is not None:
            raise InvalidInputError(f"metadata of event {event.type!r} {problem}")
        check.check_size(event.type, data, metadata, self.max_event_bytes)
        return _PreparedEvent(event, data, metadata)

    def _append_params(
        self, appends: Sequence[StreamAppend], idempotency_key: str | None, tenant: str
    ) -> dict[str, Any]:
        check.check_tenant(tenant)
        if idempotency_key is not None:
            check.check_idempotency_key(idempotency_key)
        if not appends:
            raise InvalidInputError("an append needs at least one stream")
        seen: set[str] = set()
        for a in appends:
            check.check_stream_id(a.stream_id)
            if a.stream_id in seen:
                raise InvalidInputError(
                    f"stream {a.stream_id!r} appears twice in one append; merge its events"
                )
            seen.add(a.stream_id)
            if not a.events:
                raise InvalidInputError(f"the append to stream {a.stream_id!r} has no events")
        total = sum(len(a.events) for a in appends)
        if total > self.max_events_per_append:
            raise InvalidInputError(
                f"{total} events in one append; the limit is {self.max_events_per_append}. "
                "Split the append, or use import_events for bulk loads"
            )
        # Streams are locked in a fixed order so that two multi-stream appends cannot deadlock.
        ordered = sorted(appends, key=lambda a: a.stream_id)
        prepared = [[self._prepare(e, tenant) for e in a.events] for a in ordered]
        flat = [p for group in prepared for p in group]
        expected = [_expected_code(a.expected_version) for a in ordered]
        request_hash = None
        if idempotency_key is not None:
            request_hash = _request_hash(ordered, expected, prepared)
        return {
            "tenant": tenant,
            "idempotency_key": idempotency_key,
            "request_hash": request_hash,
            "stream_ids": TextArray(a.stream_id for a in ordered),
            "expected": BigintArray(expected),
            "counts": IntArray(len(group) for group in prepared),
            "event_ids": UuidArray(p.event.event_id for p in flat),
            "types": TextArray(p.event.type for p in flat),
            "data": TextArray(p.data for p in flat),
            "metadata": TextArray(p.metadata for p in flat),
            "correlation_ids": UuidArray(p.event.correlation_id for p in flat),
            "causation_ids": UuidArray(p.event.causation_id for p in flat),
        }

    def import_events(
        self,
        events: Iterable[tuple[str, NewEvent | pydantic.BaseModel]],
        *,
        tenant: str = DEFAULT_TENANT,
    ) -> int:
        """Bulk-load (stream_id, event) pairs through COPY, in one transaction; return how many.

        Versions continue each stream (expected version: any). Meant for large loads and migrations
        from other stores; idempotency keys do not apply.
        """
        check.check_tenant(tenant)
        pairs = list(events)
        counts: dict[str, int] = {}
        for stream_id, _ in pairs:
            check.check_stream_id(stream_id)
            counts[stream_id] = counts.get(stream_id, 0) + 1
        if not pairs:
            return 0
        with self.pool.connection() as conn:
            # Room for the whole import and one partition more, before the import's transaction.
            ensure_partitions(conn, headroom=ensure_partitions(conn).partition_size + len(pairs))
        with wrap_exceptions(), self.pool.connection() as conn, conn.transaction():
            # Gap-freedom: the writer lock before the first write. The transaction has no xid yet, so its
            # stamp is its own xid, the column's default that COPY fills in.
            conn.execute(Q["log_writer"])
            reached = conn.execute(
                Q["bump_streams_for_import"],
                {"tenant": tenant, "stream_ids": list(counts), "counts": list(counts.values())},
            ).fetchall()
            next_version = {stream_id: version - counts[stream_id] + 1 for stream_id, version in reached}
            # Events are checked and serialised while the COPY streams, so client and server work at the
            # same time. A bad event raises inside the COPY: it is aborted and the transaction rolled
            # back, so nothing of the import is written.
            with conn.cursor().copy(Q["copy_events"]) as copy:
                for stream_id, event in pairs:
                    p = self._prepare(event, tenant)
                    version = next_version[stream_id]
                    next_version[stream_id] = version + 1
                    e = p.event
                    copy.write_row(
                        (
                            tenant,
                            stream_id,
                            version,
                            e.event_id,
                            e.type,
                            p.data,
                            p.metadata,
                            e.correlation_id,
                            e.causation_id,
                        )
                    )
        self.notify_appended()
        log.info("events_imported", tenant=tenant, events=len(pairs), streams=len(counts))
        return len(pairs)

    # -- reading ---------------------------------------------------------------------------------------

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
            rows = conn.execute(
                query, {"tenant": tenant, "stream_id": stream_id, "version": version, "limit": limit}
            ).fetchall()
            rows = self.personal.reveal(conn, rows, 0)
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
            rows = self.personal.reveal(conn, conn.execute(_STREAM_PAGE[backward], params).fetchall(), 0)
        events = self._shaped_encoded(tuple(_encoded(r) for r in rows), upcast)
        if not events or (len(events) < limit and int(rows[-1][0]) < budget):
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
            rows = conn.execute(
                Q["read_streams"], {"tenant": tenant, "stream_ids": list(stream_ids)}
            ).fetchall()
            rows = self.personal.reveal(conn, rows, 0)
        for event in self._shaped(rows, upcast):
            found[event.stream_id].append(event)
        return found

    def stream_version(self, stream_id: str, *, tenant: str = DEFAULT_TENANT) -> int | None:
        """The version of the stream's last event, or None if the stream does not exist."""
        check.check_tenant(tenant)
        check.check_stream_id(stream_id)
        with wrap_exceptions(), self.pool.connection() as conn:
            row = conn.execute(Q["stream_version"], {"tenant": tenant, "stream_id": stream_id}).fetchone()
        return None if row is None else int(row[0])

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
            rows = conn.execute(Q["idempotency_keys_used"], {"tenant": tenant, "keys": list(keys)}).fetchall()
        return {str(row[0]) for row in rows}

    def earlier_append(
        self,
        appends: Sequence[StreamAppend],
        *,
        idempotency_key: str,
        tenant: str = DEFAULT_TENANT,
    ) -> AppendResult | None:
        """The result of an earlier append of `appends` under `idempotency_key` (`duplicate=True`), as
        `append_many` would answer a repeat of it, but read: nothing is written or locked. None if no
        committed append used the key; other content under the key raises IdempotencyConflictError."""
        params = self._append_params(appends, idempotency_key, tenant)
        with wrap_exceptions(), self.pool.connection() as conn:
            rows = conn.execute(
                Q["earlier_append"], {"tenant": tenant, "idempotency_key": idempotency_key}
            ).fetchall()
        if not rows:
            return None
        if rows[0][0] != params["request_hash"]:
            raise IdempotencyConflictError(tenant, idempotency_key)
        rows.sort(key=lambda r: r[3])  # by position, as append_many orders its result
        return AppendResult(events=tuple(AppendedEvent(r[1], r[2], r[3], r[4]) for r in rows), duplicate=True)

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
        return ReadPage(tuple(self._shaped((r[2:] for r in rows), upcast)), cursor, caught_up)

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
        events = self._shaped_encoded(tuple(_encoded(r[2:]) for r in rows), upcast)
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
        """The page's event rows (horizon, whether its transaction had ended, running size, then the
        event's columns), where to resume, and whether the reader is caught up."""
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
            rows = c.execute(Q["read_all"], params).fetchall()
            xmin, ended = int(rows[0][0]), bool(rows[0][1])
            rows = [] if rows[0][3] is None else self.personal.reveal(c, rows, 2)
        if rows and (len(rows) == limit or int(rows[-1][2]) >= budget):
            # Stopped at the count or the byte budget: more may follow at once.
            last = rows[-1]
            return rows, Cursor(int(last[4]), int(last[3])), False
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
            xmin, head, waiting = conn.execute(Q["horizon"]).fetchone() or (0, 0, 0)
            found = conn.execute(Q["horizon_holders"], {"limit": holders}).fetchall()
        return Horizon(
            xmin=int(xmin),
            head_position=int(head or 0),
            waiting_events=int(waiting),
            holders=tuple(HorizonHolder(*row) for row in found),
        )

    def committed_so_far(self) -> Cursor:
        """A cursor that every event committed before this call lies below: a reader whose cursor reaches
        it has seen all of them (used to wait for a reader to catch up with "now")."""
        with wrap_exceptions(), self.pool.connection() as conn:
            row = conn.execute(Q["snapshot_xmax"]).fetchone()
        assert row is not None
        return Cursor(int(row[0]), 0)

    def events_beyond_horizon(self) -> bool:
        """True when committed events wait for an older writer of the log to finish before they can be
        read."""
        with wrap_exceptions(), self.pool.connection() as conn:
            row = conn.execute(Q["events_beyond_horizon"]).fetchone()
        return bool(row and row[0])

    @contextmanager
    def _connection(self, conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
        if conn is not None:
            yield conn
        else:
            with self.pool.connection() as own:
                yield own


def _no_partition(exc: LedgerflowError) -> bool:
    """Whether an append failed for want of a partition for its positions."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.errors.CheckViolation) and "no partition" in str(cause)


def _with_bumps(query: LiteralString) -> dict[ExpectedState | None, bytes]:
    """`query` completed with each way of moving a stream's version; None: an exact version, or
    STREAM_EXISTS (no version condition). Rendered once to bytes: a composed query would be rendered
    again on every execution."""
    bumps = {ExpectedState.ANY: "bump_any", ExpectedState.NO_STREAM: "bump_no_stream", None: "bump_existing"}
    return {
        k: sql.SQL(query).format(writer=sql.SQL(Q["writer"]), bump=sql.SQL(Q[name])).as_bytes()
        for k, name in bumps.items()
    }


_ONE_STREAM = _with_bumps(Q["append_one_stream"])
#: The stream page query for each direction (key: backward).
_STREAM_PAGE = {
    backward: sql.SQL(Q["read_stream_page"]).format(next=sql.SQL(Q[name]))
    for backward, name in ((False, "next_forward"), (True, "next_backward"))
}
_ONE_EVENT = _with_bumps(Q["append_one_event"])
#: The same statements for `eventstore.direct`, by the same keys.
_ONE_EVENT_DIRECT = {
    key: direct.DirectStatement.of(f"append_one_event_{'exact' if key is None else key.name.lower()}", query)
    for key, query in _ONE_EVENT.items()
}


def _bump_key(expected: ExpectedVersion) -> ExpectedState | None:
    return expected if expected is ExpectedState.ANY or expected is ExpectedState.NO_STREAM else None


def _one_stream(append: StreamAppend, params: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The single-statement form of a one-stream append of several events without an idempotency key."""
    expected = append.expected_version
    one = {
        **params,
        "stream_id": append.stream_id,
        "count": len(append.events),
        "expected": expected if isinstance(expected, int) and not isinstance(expected, bool) else None,
    }
    return _ONE_STREAM[_bump_key(expected)], one


def _wrong_version(
    conn: psycopg.Connection[Any] | psycopg.Cursor[Any],
    tenant: str,
    stream_id: str,
    expected: ExpectedVersion,
) -> None:
    """A single-stream statement inserted nothing: the expected version does not hold; say which it is."""
    row = synced(conn.execute(Q["stream_version"], {"tenant": tenant, "stream_id": stream_id})).fetchone()
    raise WrongExpectedVersionError(
        tenant, stream_id, _describe(expected), None if row is None else int(row[0])
    )


def _describe(expected: ExpectedVersion) -> str:
    if isinstance(expected, ExpectedState):
        return expected.name.lower().replace("_", " ")
    return f"version {expected}"


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InvalidInputError(f"limit {limit!r} is invalid: use 1 to 100000")


def _request_hash(
    appends: Sequence[StreamAppend], expected: Sequence[int], prepared: Sequence[Sequence[_PreparedEvent]]
) -> str:
    """A fingerprint of an append's content. Event ids are left out: a retry that generates fresh ids
    for the same content is the same request."""
    content = [
        [
            a.stream_id,
            code,
            [
                [
                    p.event.type,
                    dict(p.event.data),
                    dict(p.event.metadata),
                    str(p.event.correlation_id),
                    str(p.event.causation_id),
                ]
                for p in group
            ],
        ]
        for a, code, group in zip(appends, expected, prepared, strict=True)
    ]
    # sort_keys: the same mapping built in another key order is the same content.
    canonical = jsonvalue.dumps(content, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()

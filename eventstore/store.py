"""The event store: an append-only PostgreSQL log with optimistic concurrency, idempotent appends and
gap-free reading. `EventStore` is put together from one part per job: building an append's statement
(`eventstore.append_statements`), sending it on one path (`eventstore.appending`) and reading
(`eventstore.reading`); these are the only modules of `eventstore` that run log SQL."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool
import pydantic
import structlog

from eventstore import _validation as check
from eventstore.append_statements import AppendStatements
from eventstore.appending import AppendPath
from eventstore.db import wrap_exceptions
from eventstore.errors import IdempotencyConflictError
from eventstore.events import (
    START,
    AppendedEvent,
    AppendResult,
    Cursor,
    ExpectedState,
    ExpectedVersion,
    NewEvent,
    StreamAppend,
)
from eventstore.eventtypes import DEFAULT_TYPES, EventTypes
from eventstore.keys import SubjectKeys
from eventstore.masterkeys import MasterKeys
from eventstore.notify import Notifier
from eventstore.partitions import ensure_partitions
from eventstore.personal import Shredder
from eventstore.pinning import PinnedConnections
from eventstore.pooling import Pool
from eventstore.reading import DEFAULT_TENANT, Horizon, HorizonHolder, LogReading
from eventstore.rows import fetch_all
from eventstore.sqlfile import load_queries

if TYPE_CHECKING:
    from eventstore.subscribe import Subscription

__all__ = ["DEFAULT_TENANT", "EventStore", "Horizon", "HorizonHolder"]

log = structlog.get_logger(__name__)
Q = load_queries("eventstore")


class EventStore(AppendStatements, AppendPath, LogReading):
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
            pool.give_back_unused = self._pins.give_back_unused  # idle slots go back to the server
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

    def shed_idle_connections(self) -> int:
        """Close the pool's connections no thread uses right now, down to its minimum; how many. For a
        connection of the process's own (a listener) that a full server refused (see
        `eventstore.pooling.Pool.shed_idle`)."""
        return self.pool.shed_idle() if isinstance(self.pool, Pool) else 0

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(self, after: Cursor = START, **options: Any) -> Subscription:
        """Follow the log from `after`; see `eventstore.subscribe.Subscription` for the options."""
        from eventstore.subscribe import Subscription

        return Subscription(self, self.url, after, **options)

    @contextmanager
    def connection(self, *, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A connection from the store's pool, for statements of the caller's own (an operator's read, a
        probe), given back when the block ends: a transaction left open is rolled back, a broken
        connection discarded. The database boundary for its user: a driver error raised in the block, by
        the checkout (waiting longer than `timeout`, default the pool's) or by a statement, comes out as a
        LedgerflowError (its `__cause__` the driver's)."""
        with wrap_exceptions(), self.pool.connection(timeout=timeout) as conn:
            yield conn

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
            return self._write(
                self._one_event_statement(stream_id, events[0], expected_version, tenant), conn
            )
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
        return self._write(self._statement(appends, idempotency_key, tenant), conn)

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
            rows = fetch_all(
                conn,
                _EarlierEvent,
                Q["earlier_append"],
                {"tenant": tenant, "idempotency_key": idempotency_key},
            )
        if not rows:
            return None
        if rows[0].request_hash != params["request_hash"]:
            raise IdempotencyConflictError(tenant, idempotency_key)
        rows.sort(key=lambda r: r.position)  # by position, as append_many orders its result
        events = tuple(
            AppendedEvent(r.stream_id, r.stream_version, r.position, r.transaction_id) for r in rows
        )
        return AppendResult(events=events, duplicate=True)


@dataclass(frozen=True, slots=True)
class _EarlierEvent:
    """A row of earlier_append (queries.sql): the key's request hash, and one event the append wrote."""

    request_hash: str
    stream_id: str
    stream_version: int
    position: int
    transaction_id: int

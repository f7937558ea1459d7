"""The projector's failure rows: events a projection could not apply, and the operator's retry or skip.

Each function takes the caller's connection, so callers combine them in one transaction where a guarantee
needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from eventstore import Cursor, RecordedEvent
from eventstore.spi import fetch_all, fetch_value, fetch_values, load_queries

Q = load_queries("projector")
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Failure:
    id: int
    projection: str
    event_position: int
    event_tx: int
    event_id: UUID
    tenant: str
    stream_id: str
    stream_version: int
    event_type: str
    policy: str
    status: str
    error_class: str
    error_message: str
    attempts: int
    first_seen: datetime
    last_seen: datetime
    resolved_at: datetime | None
    resolved_by: str | None


def record_failure(
    conn: Conn, projection: str, event: RecordedEvent, policy: str, error: BaseException, attempts: int
) -> int:
    failure_id = fetch_value(
        conn,
        Q["record_failure"],
        {
            "projection": projection,
            "position": event.position,
            "tx": event.transaction_id,
            "event_id": event.event_id,
            "tenant": event.tenant,
            "stream_id": event.stream_id,
            "stream_version": event.stream_version,
            "event_type": event.type,
            "policy": policy,
            "error_class": f"{type(error).__module__}.{type(error).__qualname__}",
            "error_message": str(error)[:4000],
            "attempts": attempts,
        },
    )
    assert failure_id is not None
    return int(failure_id)


def open_failures(conn: Conn, projection: str) -> list[Failure]:
    with conn.cursor(row_factory=class_row(Failure)) as cur:
        return cur.execute(Q["open_failures"], {"projection": projection}).fetchall()


def list_failures(
    conn: Conn, projection: str | None, *, include_closed: bool, limit: int = 100, tenant: str | None = None
) -> list[Failure]:
    """Newest first. With `tenant`: only failures of that tenant's events."""
    params = {"projection": projection, "all": include_closed, "limit": limit, "tenant": tenant}
    with conn.cursor(row_factory=class_row(Failure)) as cur:
        return cur.execute(Q["list_failures"], params).fetchall()


def get_failure(conn: Conn, failure_id: int, tenant: str | None = None) -> Failure | None:
    with conn.cursor(row_factory=class_row(Failure)) as cur:
        return cur.execute(Q["get_failure"], {"failure_id": failure_id, "tenant": tenant}).fetchone()


def skipped_positions(conn: Conn, projection: str) -> set[int]:
    return set(fetch_values(conn, Q["skipped_positions"], {"projection": projection}))


def projection_skipped_positions(conn: Conn, projection: str) -> set[int]:
    """Skipped events of the projection and of all its segments."""
    return set(fetch_values(conn, Q["projection_skipped_positions"], {"projection": projection}))


def projection_open_failures(conn: Conn, projection: str) -> list[Failure]:
    """Open failures of the projection and of all its segments."""
    with conn.cursor(row_factory=class_row(Failure)) as cur:
        return cur.execute(Q["projection_open_failures"], {"projection": projection}).fetchall()


def request_failure_retry(conn: Conn, failure_id: int, actor: str, tenant: str | None = None) -> bool:
    """False when no open failure has this id (or, with `tenant`, none of that tenant's)."""
    params = {"failure_id": failure_id, "actor": actor, "tenant": tenant}
    return conn.execute(Q["request_failure_retry"], params).fetchone() is not None


def request_failure_skip(conn: Conn, failure_id: int, actor: str, tenant: str | None = None) -> bool:
    params = {"failure_id": failure_id, "actor": actor, "tenant": tenant}
    return conn.execute(Q["request_failure_skip"], params).fetchone() is not None


def close_failure(conn: Conn, failure_id: int, status: Literal["resolved", "skipped"]) -> None:
    conn.execute(Q["close_failure"], {"failure_id": failure_id, "status": status})


def failure_events(conn: Conn, failure: Failure, from_version: int, until: Cursor) -> list[RecordedEvent]:
    """The failed stream's events from `from_version` up to `until` (the projection's cursor)."""
    params = {
        "tenant": failure.tenant,
        "stream_id": failure.stream_id,
        "from_version": from_version,
        "tx": str(until.transaction_id),
        "position": until.position,
    }
    return fetch_all(conn, RecordedEvent, Q["failure_events"], params)

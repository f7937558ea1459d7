"""The projector's cursor rows: where each projection (and each segment of a partitioned one) has read to,
and how far a reader at a cursor trails the log.

Each function takes the caller's connection, so callers combine them in one transaction where a guarantee
needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from eventstore import Cursor
from eventstore.spi import fetch_all, fetch_one, load_queries

Q = load_queries("projector")
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class CursorState:
    cursor: Cursor
    version: int
    events_applied: int
    #: The number of segments the projection was built with (1: unpartitioned).
    partitions: int = 1


def ensure_cursor(conn: Conn, projection: str, version: int, partitions: int = 1) -> CursorState:
    params = {"projection": projection, "version": version, "partitions": partitions}
    conn.execute(Q["ensure_cursor"], params)
    state = get_cursor(conn, projection)
    assert state is not None
    return state


def _cursor_state(
    *, cursor_tx: int, cursor_position: int, version: int, events_applied: int, partitions: int
) -> CursorState:
    """A row of get_cursor."""
    return CursorState(Cursor(cursor_tx, cursor_position), version, events_applied, partitions)


def get_cursor(conn: Conn, projection: str) -> CursorState | None:
    return fetch_one(conn, _cursor_state, Q["get_cursor"], {"projection": projection})


@dataclass(frozen=True, slots=True)
class _SegmentCursor:
    """A row of segment_cursors and lock_segment_cursors."""

    segment: int
    cursor_tx: int
    cursor_position: int


def segment_cursors(conn: Conn, projection: str) -> dict[int, Cursor]:
    """The cursor of each segment of a partitioned projection, by segment."""
    rows = fetch_all(conn, _SegmentCursor, Q["segment_cursors"], {"projection": projection})
    return {r.segment: Cursor(r.cursor_tx, r.cursor_position) for r in rows}


def lock_segment_cursors(conn: Conn, projection: str) -> dict[int, Cursor]:
    """As `segment_cursors`, each row locked until the caller's transaction ends (after `lock_cursor`)."""
    rows = fetch_all(conn, _SegmentCursor, Q["lock_segment_cursors"], {"projection": projection})
    return {r.segment: Cursor(r.cursor_tx, r.cursor_position) for r in rows}


def set_partitions(conn: Conn, projection: str, partitions: int) -> None:
    conn.execute(Q["set_partitions"], {"projection": projection, "partitions": partitions})


def reset_segments(conn: Conn, projection: str, partitions: int, cursor: Cursor, version: int) -> None:
    """Inside a swap: segments 0..partitions-1 at `cursor`, no other segment row left."""
    params = {
        "projection": projection,
        "partitions": partitions,
        "tx": cursor.transaction_id,
        "position": cursor.position,
        "version": version,
    }
    conn.execute(Q["reset_segments"], params)


def lock_cursor(conn: Conn, projection: str) -> tuple[Cursor, int]:
    locked = fetch_one(conn, _locked_cursor, Q["lock_cursor"], {"projection": projection})
    if locked is None:
        raise LookupError(f"projection {projection!r} has no cursor yet")
    return locked


def _locked_cursor(*, cursor_tx: int, cursor_position: int, version: int) -> tuple[Cursor, int]:
    """A row of lock_cursor."""
    return Cursor(cursor_tx, cursor_position), version


def advance_cursor(conn: Conn, projection: str, old: Cursor, new: Cursor, applied: int) -> bool:
    row = conn.execute(
        Q["advance_cursor"],
        {
            "projection": projection,
            "old_tx": old.transaction_id,
            "old_position": old.position,
            "new_tx": new.transaction_id,
            "new_position": new.position,
            "applied": applied,
        },
    ).fetchone()
    return row is not None


def set_cursor(conn: Conn, projection: str, cursor: Cursor, version: int) -> None:
    conn.execute(
        Q["set_cursor"],
        {
            "projection": projection,
            "tx": cursor.transaction_id,
            "position": cursor.position,
            "version": version,
        },
    )


def first_cursor_since(conn: Conn, since: datetime) -> Cursor | None:
    return fetch_one(conn, Cursor, Q["first_cursor_since"], {"since": since})


def type_list(types: Sequence[str] | None) -> list[str] | None:
    """Event types as a query parameter: psycopg sends a list as an array, not a tuple."""
    return None if types is None else list(types)


@dataclass(frozen=True)
class Lag:
    behind_horizon: int
    behind_head: int
    oldest_seconds: float
    horizon_xmin: int


def lag(conn: Conn, cursor: Cursor, types: Sequence[str] | None = None) -> Lag:
    """How far a reader at `cursor` of events of `types` (all, with None) trails."""
    params = {"tx": str(cursor.transaction_id), "position": cursor.position, "types": type_list(types)}
    found = fetch_one(conn, Lag, Q["lag"], params)
    assert found is not None  # the statement answers one row
    return found

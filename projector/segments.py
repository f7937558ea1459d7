"""Segments of a partitioned projection: which streams each holds, and the keys of its bookkeeping rows.

A projection with `partitions = N` (N > 1) is applied as N independent segments. A stream belongs to the
segment `stream_segment(stream_id, N)`: md5 of the stream id, first 28 bits, modulo N, computed by the
server when it reads a segment's events (`ledgerflow.stream_segment`, migration 0065) and the same here.
Every event of a stream lies in one segment, so a stream's events are applied in order, by one worker at a
time; events of different segments are applied in parallel, in no order between them.

Each segment keeps a cursor row, a lease, catch-up runs and failures of its own, under the key
`<projection>#<k>`; the projection's own cursor row keeps its version and its number of partitions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import psycopg

from eventstore import ConflictError, Cursor
from projector import cursor_rows
from projector.projection import Projection

SEPARATOR = "#"


def stream_segment(stream_id: str, partitions: int) -> int:
    """The segment of `stream_id` among `partitions`: as `ledgerflow.stream_segment` in SQL."""
    return int(hashlib.md5(stream_id.encode(), usedforsecurity=False).hexdigest()[:7], 16) % partitions


def segment_key(projection: str, segment: int) -> str:
    return f"{projection}{SEPARATOR}{segment}"


def split_key(key: str) -> tuple[str, int | None]:
    """(projection, segment) of a bookkeeping key; segment None for an unpartitioned projection's key."""
    name, sep, segment = key.partition(SEPARATOR)
    return (name, int(segment)) if sep else (name, None)


@dataclass(frozen=True)
class Unit:
    """What one lease covers: a whole projection, or one segment of a partitioned one."""

    projection: Projection
    segment: int | None = None

    @property
    def key(self) -> str:
        """The name its cursor row, lease, catch-up runs and failures are recorded under."""
        if self.segment is None:
            return self.projection.name
        return segment_key(self.projection.name, self.segment)

    @property
    def read_segment(self) -> tuple[int, int] | None:
        """The `segment` argument of `read_all` for this unit's events."""
        return None if self.segment is None else (self.segment, self.projection.partitions)


def units_of(projection: Projection) -> list[Unit]:
    if projection.partitions == 1:
        return [Unit(projection)]
    return [Unit(projection, k) for k in range(projection.partitions)]


class PartitionsChangedError(ConflictError):
    """The projection's code asks for another number of partitions than its tables were built with.

    Its segments' cursors would mean other streams under the new number, so it is not run until a rebuild
    has built it anew with the new number."""

    code = "projection_partitions_changed"

    def __init__(self, projection: str, stored: int, code: int) -> None:
        self.projection, self.stored, self.wanted = projection, stored, code
        super().__init__(
            f"projection {projection!r} was built with partitions={stored}, its code now says "
            f"partitions={code}; it is not run until it is rebuilt: "
            f"`ledgerflow projections rebuild {projection}` "
            "(or bump its version, so the projector rebuilds it)"
        )


def ensure_cursors(conn: psycopg.Connection[Any], projection: Projection) -> cursor_rows.CursorState:
    """Create the projection's cursor row if missing (with its code's version and partitions) and, while
    the stored number of partitions is the code's, any missing segment row, at the projection's own
    cursor: where a swap last put every segment, or the start of the log for a new projection. Returns the
    projection's own row."""
    current = cursor_rows.ensure_cursor(conn, projection.name, projection.version, projection.partitions)
    if projection.partitions > 1 and current.partitions == projection.partitions:
        present = cursor_rows.segment_cursors(conn, projection.name)
        if len(present) < projection.partitions:
            cursor_rows.lock_cursor(conn, projection.name)  # one creator at a time: a swap holds this row too
            present = cursor_rows.segment_cursors(conn, projection.name)
            for k in range(projection.partitions):
                if k not in present:
                    cursor_rows.ensure_cursor(conn, segment_key(projection.name, k), projection.version)
                    cursor_rows.set_cursor(
                        conn, segment_key(projection.name, k), current.cursor, current.version
                    )
    return current


def check_partitions(projection: Projection, stored: cursor_rows.CursorState) -> None:
    if stored.partitions != projection.partitions:
        raise PartitionsChangedError(projection.name, stored.partitions, projection.partitions)


def lock_unit_cursors(conn: psycopg.Connection[Any], projection: Projection) -> dict[str, Cursor]:
    """The cursor of each unit of `projection` (its own, or each segment's), by key, every row locked until
    the caller's transaction ends. The projection's own row first, then its segments' in order: a swap's
    order, and a live batch holds one of these rows only, so none of them deadlock. Refuses a partitioned
    projection whose stored number of partitions is not its code's (its segments mean other streams)."""
    own, _ = cursor_rows.lock_cursor(conn, projection.name)
    if projection.partitions == 1:
        return {projection.name: own}
    stored = cursor_rows.get_cursor(conn, projection.name)
    assert stored is not None
    check_partitions(projection, stored)
    segments = cursor_rows.lock_segment_cursors(conn, projection.name)
    missing = [k for k in range(projection.partitions) if k not in segments]
    if missing:  # `ensure_cursors` creates them before any run starts
        raise LookupError(f"projection {projection.name!r} has no cursor row for segments {missing}")
    return {segment_key(projection.name, k): segments[k] for k in range(projection.partitions)}


def projection_cursor(conn: psycopg.Connection[Any], projection: Projection) -> Cursor | None:
    """How far the projection's tables show the log (None before it first ran): its cursor, or for a
    partitioned one the lowest of its segments' cursors."""
    current = cursor_rows.get_cursor(conn, projection.name)
    if current is None:
        return None
    if current.partitions == 1:
        return current.cursor
    segments = cursor_rows.segment_cursors(conn, projection.name)
    return min(segments.values()) if segments else current.cursor

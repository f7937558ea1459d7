"""Where a run stands with retention, read from its own stream: released (its rows left the run tables)
or not, and whether the log still holds every event of it (what a restore needs).

A separate module from `workflows.retention`, which acts: the engine asks it too, so that it refuses to
retry or refresh a released run (the tables would not show the run that then goes on).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from eventstore.spi import load_queries
from workflows import events as ev

Q = load_queries("workflows", "release_marks.sql")


@dataclass(frozen=True)
class Release:
    """A run retention let go: when, by whom, and the RunReleased event's version in the run's stream."""

    run_id: uuid.UUID
    released_at: datetime
    actor: str | None
    version: int
    #: True for a restore (then `released_at` is when it was restored).
    restored: bool = False


def current_release(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> Release | None:
    """The run's release if its latest retention event is one (None: never released, or restored since)."""
    mark = last_mark(conn, run_id, tenant)
    return mark if mark is not None and mark.restored is False else None


def last_marks(
    conn: psycopg.Connection[Any], run_ids: Sequence[uuid.UUID], tenant: str
) -> dict[uuid.UUID, Release]:
    """`last_mark` for many runs, in one query: the runs without a release or restore are left out."""
    streams = {ev.run_stream(run_id): run_id for run_id in run_ids}
    if not streams:
        return {}
    rows = conn.execute(Q["last_marks"], {"tenant": tenant, "streams": list(streams)}).fetchall()
    return {
        streams[row[0]]: Release(streams[row[0]], row[2], row[3], row[4], restored=row[1] == ev.RUN_RESTORED)
        for row in rows
    }


def last_restore(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> datetime | None:
    """When the run was restored, if its latest retention event is a restore: a restored run stays for
    another retention from then, so that it can be inspected."""
    mark = last_mark(conn, run_id, tenant)
    return mark.released_at if mark is not None and mark.restored else None


def last_mark(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> Release | None:
    params = {"tenant": tenant, "stream": ev.run_stream(run_id)}
    row = conn.execute(Q["last_mark"], params).fetchone()
    if row is None:
        return None
    return Release(run_id, row[1], row[2], row[3], restored=row[0] == ev.RUN_RESTORED)


def events_missing(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> int:
    """How many of the run's events the log does not hold now (they are in archived partitions)."""
    row = conn.execute(Q["extent"], {"tenant": tenant, "stream": ev.run_stream(run_id)}).fetchone()
    count, last = (row[0], row[1]) if row is not None else (0, 0)
    return int(last) - int(count)


def parent_of(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> uuid.UUID | None:
    """The run that started this one, as the run's start names it (None for other runs)."""
    row = conn.execute(Q["started"], {"tenant": tenant, "stream": ev.run_stream(run_id)}).fetchone()
    try:
        return uuid.UUID(row[0]) if row is not None and row[0] is not None else None
    except ValueError:
        return None

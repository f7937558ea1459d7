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

from eventstore.spi import fetch_all, fetch_one, fetch_value, load_queries
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
    marks = fetch_all(conn, _Mark, Q["last_marks"], {"tenant": tenant, "streams": list(streams)})
    return {streams[m.stream_id]: m.release(streams[m.stream_id]) for m in marks if m.stream_id is not None}


@dataclass(frozen=True, slots=True)
class _Mark:
    """A row of last_marks (and of last_mark, without the stream): a run's latest release or restore."""

    stream_id: str | None
    event_type: str
    recorded_at: datetime
    actor: str | None
    stream_version: int

    def release(self, run_id: uuid.UUID) -> Release:
        restored = self.event_type == ev.RUN_RESTORED
        return Release(run_id, self.recorded_at, self.actor, self.stream_version, restored=restored)


def last_restore(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> datetime | None:
    """When the run was restored, if its latest retention event is a restore: a restored run stays for
    another retention from then, so that it can be inspected."""
    mark = last_mark(conn, run_id, tenant)
    return mark.released_at if mark is not None and mark.restored else None


def last_mark(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> Release | None:
    params = {"tenant": tenant, "stream": ev.run_stream(run_id)}
    mark = fetch_one(conn, _Mark, Q["last_mark"], params)
    return None if mark is None else mark.release(run_id)


def archived_events_message(run_id: uuid.UUID, missing: int) -> str:
    """What an operator reads of a run whose events are (some or all) in archived partitions of the log."""
    return (
        f"{missing} of run {run_id}'s events are in archived partitions of the log: restore them first "
        f"(`ledgerflow log restore DIR/NAME.manifest.json`), then the run (`ledgerflow workflows restore "
        f"{run_id}`)"
    )


def events_missing(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> int:
    """How many of the run's events the log does not hold now (they are in archived partitions)."""
    extent = fetch_one(conn, _Extent, Q["extent"], {"tenant": tenant, "stream": ev.run_stream(run_id)})
    return 0 if extent is None else extent.last_version - extent.events


@dataclass(frozen=True, slots=True)
class _Extent:
    """A row of extent: how many of a stream's events the log holds, and its last version."""

    events: int
    last_version: int


def parent_of(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant: str) -> uuid.UUID | None:
    """The run that started this one, as the run's start names it (None for other runs)."""
    parent = fetch_value(conn, Q["started"], {"tenant": tenant, "stream": ev.run_stream(run_id)})
    try:
        return uuid.UUID(parent) if parent is not None else None
    except ValueError:
        return None

"""The projector's bookkeeping in the database: cursors, leases, runs, failures, lag.

The only module of `projector` that runs bookkeeping SQL; each function takes the caller's connection,
so callers combine them in one transaction where a guarantee needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from eventstore import Cursor, RecordedEvent
from eventstore.spi import fetch_all, fetch_one, fetch_value, fetch_values, load_queries

Q = load_queries("projector")
Conn = psycopg.Connection[Any]

RunKind = Literal["catch_up", "replay", "rebuild", "verify"]
RunStatus = Literal["running", "completed", "failed", "abandoned", "stopped"]


@dataclass(frozen=True)
class CursorState:
    cursor: Cursor
    version: int
    events_applied: int
    #: The number of segments the projection was built with (1: unpartitioned).
    partitions: int = 1


@dataclass(frozen=True)
class Run:
    id: int
    projection: str
    kind: str
    trigger: str
    actor: str
    owner: str
    status: str
    start_tx: int
    start_position: int
    end_tx: int | None
    end_position: int | None
    target_tx: int | None
    target_position: int | None
    events_processed: int
    started_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None
    digest: str | None
    error: str | None
    #: The tenant whose rows the run touched; None for a run over every tenant.
    tenant: str | None
    #: The events it goes through, counted at its start; None when not counted (catch-up runs).
    events_total: int | None = None

    @property
    def rate(self) -> float:
        """Events per second over the run so far."""
        end = self.ended_at or self.heartbeat_at
        seconds = (end - self.started_at).total_seconds()
        return self.events_processed / seconds if seconds > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """At the rate so far, the time until the events counted at the start are through."""
        if self.status != "running" or self.events_total is None or self.rate <= 0:
            return None
        return max(0.0, (self.events_total - self.events_processed) / self.rate)


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


# -- leases -----------------------------------------------------------------------------------------


def acquire_lease(conn: Conn, projection: str, owner: str, ttl: float) -> int | None:
    epoch: int | None = fetch_value(
        conn, Q["acquire_lease"], {"projection": projection, "owner": owner, "ttl": ttl}
    )
    return epoch


def renew_lease(conn: Conn, projection: str, owner: str, epoch: int, ttl: float) -> bool:
    params = {"projection": projection, "owner": owner, "epoch": epoch, "ttl": ttl}
    return bool(fetch_value(conn, Q["renew_lease"], params))


def release_lease(conn: Conn, projection: str, owner: str, epoch: int) -> None:
    conn.execute(Q["release_lease"], {"projection": projection, "owner": owner, "epoch": epoch})


def hold_lease(conn: Conn, projection: str, owner: str, epoch: int, ttl: float) -> bool:
    params = {
        "projection": projection,
        "owner": owner,
        "epoch": epoch,
        "idle_ms": str(max(1, int(ttl * 1000))),
    }
    return conn.execute(Q["hold_lease"], params).fetchone() is not None


@dataclass(frozen=True)
class LeaseInfo:
    owner: str
    epoch: int
    alive: bool
    heartbeat_at: datetime
    expires_at: datetime


def lease_of(conn: Conn, projection: str) -> LeaseInfo | None:
    return fetch_one(conn, LeaseInfo, Q["lease_of"], {"projection": projection})


@dataclass(frozen=True)
class SegmentLease:
    segment: int
    owner: str
    alive: bool
    #: Seconds since it lapsed (negative while alive).
    lapsed_for: float


def segment_leases(conn: Conn, projection: str) -> dict[int, SegmentLease]:
    leases = fetch_all(conn, SegmentLease, Q["segment_leases"], {"projection": projection})
    return {lease.segment: lease for lease in leases}


def live_workers(conn: Conn, application_name: str) -> int:
    return int(fetch_value(conn, Q["live_workers"], {"application_name": application_name}) or 0)


# -- runs -------------------------------------------------------------------------------------------


def _types(types: Sequence[str] | None) -> list[str] | None:
    return None if types is None else list(types)


def count_run_events(
    conn: Conn,
    run_id: int,
    *,
    start: Cursor,
    target: Cursor | None,
    tenant: str | None,
    types: Sequence[str] | None,
) -> int:
    """Count the events (of `types`; all with None) run `run_id` goes through; record it on the run."""
    counted = fetch_value(
        conn,
        Q["count_run_events"],
        {
            "run_id": run_id,
            "tenant": tenant,
            "types": _types(types),
            "start_tx": start.transaction_id,
            "start_position": start.position,
            "target_tx": target.transaction_id if target else None,
            "target_position": target.position if target else None,
        },
    )
    return int(counted or 0)


def start_run(
    conn: Conn,
    projection: str,
    kind: RunKind,
    *,
    trigger: str,
    actor: str,
    owner: str,
    start: Cursor,
    target: Cursor | None = None,
    tenant: str | None = None,
) -> int:
    run_id = fetch_value(
        conn,
        Q["start_run"],
        {
            "projection": projection,
            "kind": kind,
            "trigger": trigger,
            "actor": actor,
            "owner": owner,
            "tenant": tenant,
            "start_tx": start.transaction_id,
            "start_position": start.position,
            "target_tx": target.transaction_id if target else None,
            "target_position": target.position if target else None,
        },
    )
    assert run_id is not None
    return int(run_id)


def run_progress(conn: Conn, run_id: int, cursor: Cursor, events: int) -> None:
    conn.execute(
        Q["run_progress"],
        {"run_id": run_id, "tx": cursor.transaction_id, "position": cursor.position, "events": events},
    )


def heartbeat_runs(conn: Conn, owner: str) -> None:
    conn.execute(Q["heartbeat_runs"], {"owner": owner})


def heartbeat_run(conn: Conn, run_id: int) -> None:
    conn.execute(Q["heartbeat_run"], {"run_id": run_id})


def finish_run(
    conn: Conn, run_id: int, status: RunStatus, *, error: str | None = None, digest: str | None = None
) -> None:
    conn.execute(Q["finish_run"], {"run_id": run_id, "status": status, "error": error, "digest": digest})


def mark_abandoned_runs(conn: Conn, timeout: float) -> list[tuple[int, str, str, str]]:
    return [tuple(r) for r in conn.execute(Q["mark_abandoned_runs"], {"timeout": timeout}).fetchall()]


def list_runs(
    conn: Conn, projection: str | None = None, limit: int = 50, *, tenant: str | None = None
) -> list[Run]:
    """Newest first. With `tenant`: the runs over every tenant and that tenant's own, no other's."""
    params = {"projection": projection, "limit": limit, "tenant": tenant}
    with conn.cursor(row_factory=class_row(Run)) as cur:
        return cur.execute(Q["list_runs"], params).fetchall()


def get_run(conn: Conn, run_id: int) -> Run | None:
    with conn.cursor(row_factory=class_row(Run)) as cur:
        return cur.execute(Q["get_run"], {"run_id": run_id}).fetchone()


def running_operator_run(conn: Conn, projection: str, tenant: str | None) -> tuple[int, str] | None:
    """(id, kind) of the rebuild, replay or verify holding this scope, if one runs."""
    params = {"projection": projection, "tenant": tenant}
    return fetch_one(conn, _run_and_kind, Q["running_operator_run"], params)


def _run_and_kind(*, id: int, kind: str) -> tuple[int, str]:
    """A row of running_operator_run."""
    return id, kind


def scratch_schemas(conn: Conn) -> list[str]:
    return fetch_values(conn, Q["scratch_schemas"])


def running_run_ids(conn: Conn) -> set[int]:
    return set(fetch_values(conn, Q["running_run_ids"]))


# -- failures ---------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Lag:
    behind_horizon: int
    behind_head: int
    oldest_seconds: float
    horizon_xmin: int


def lag(conn: Conn, cursor: Cursor, types: Sequence[str] | None = None) -> Lag:
    """How far a reader at `cursor` of events of `types` (all, with None) trails."""
    params = {"tx": str(cursor.transaction_id), "position": cursor.position, "types": _types(types)}
    found = fetch_one(conn, Lag, Q["lag"], params)
    assert found is not None  # the statement answers one row
    return found


def active_run(conn: Conn, projection: str, kind: RunKind) -> tuple[int, Cursor | None] | None:
    return fetch_one(conn, _run_and_target, Q["active_run"], {"projection": projection, "kind": kind})


def _run_and_target(
    *,
    id: int,
    target_tx: int | None,
    target_position: int | None,
) -> tuple[int, Cursor | None]:
    """A row of active_run."""
    return id, None if target_tx is None or target_position is None else Cursor(target_tx, target_position)


def first_cursor_since(conn: Conn, since: datetime) -> Cursor | None:
    return fetch_one(conn, Cursor, Q["first_cursor_since"], {"since": since})

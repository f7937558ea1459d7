"""Projection health: cursor, lag, state, owner, last run and open failures, per projection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eventstore import Cursor, EventStore
from projector import cursor_rows, failure_rows, lease_rows, run_rows
from projector.operator_runs import sweep_abandoned
from projector.projection import Projection
from projector.segments import segment_key


@dataclass(frozen=True)
class SegmentHealth:
    """One segment of a partitioned projection: where it stands and who applies it."""

    segment: int
    cursor: Cursor
    owner: str | None
    open_failures: int


@dataclass(frozen=True)
class ProjectionHealth:
    name: str
    version: int
    #: running, catching_up, blocked, rebuilding, replaying, stopped (no live owner), new (never run)
    state: str
    cursor: Cursor
    lag_events: int
    lag_events_head: int
    lag_seconds: float
    owner: str | None
    open_failures: int
    last_run: str | None
    #: 1 for an unpartitioned projection; then `segments` is empty. Of a partitioned one, `cursor` is the
    #: lowest segment's and the lag counts from there (an upper bound), `owner` lists the segments' owners.
    partitions: int = 1
    segments: tuple[SegmentHealth, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cursor"] = str(self.cursor)
        d["segments"] = [{**asdict(g), "cursor": str(g.cursor)} for g in self.segments]
        return d


def projection_health(
    store: EventStore,
    projections: Sequence[Projection],
    *,
    abandoned_after: float | None = None,
    tenant: str | None = None,
) -> list[ProjectionHealth]:
    """Every projection's health. With `tenant`, as that tenant may see it: its own open failures, and
    runs over every tenant or its own (never another tenant's)."""
    found: list[ProjectionHealth] = []
    with store.connection() as conn:
        if abandoned_after is not None:
            sweep_abandoned(conn, abandoned_after)
        for p in projections:
            current = cursor_rows.get_cursor(conn, p.name)
            cursor = current.cursor if current else Cursor()
            segments = _segments(conn, p.name, tenant) if current and current.partitions > 1 else ()
            if segments:
                cursor = min(g.cursor for g in segments)
            lag = cursor_rows.lag(conn, cursor, p.event_types)
            lease = lease_rows.lease_of(conn, p.name)
            failures = failure_rows.projection_open_failures(conn, p.name)
            # A failure blocks every tenant's rows, so the state says "blocked" to all; the count (and
            # the failures an API lists) are the tenant's own.
            own = failures if tenant is None else [f for f in failures if f.tenant == tenant]
            runs = run_rows.list_runs(conn, p.name, limit=5, tenant=tenant)
            active = {r.kind for r in runs if r.status == "running"}
            owner = lease.owner if lease and lease.alive else None
            if segments:
                owners = sorted({g.owner for g in segments if g.owner is not None})
                owner = ", ".join(owners) if owners else None
            if current is None:
                status = "new"
            elif any(f.policy == "block" and f.status == "open" for f in failures):
                status = "blocked"
            elif "rebuild" in active:
                status = "rebuilding"
            elif "replay" in active:
                status = "replaying"
            elif owner is None:
                status = "stopped"
            elif "catch_up" in active or lag.behind_horizon > 0:
                status = "catching_up"
            else:
                status = "running"
            last = runs[0] if runs else None
            found.append(
                ProjectionHealth(
                    name=p.name,
                    version=current.version if current else p.version,
                    state=status,
                    cursor=cursor,
                    lag_events=lag.behind_horizon,
                    lag_events_head=lag.behind_head,
                    lag_seconds=lag.oldest_seconds,
                    owner=owner,
                    open_failures=len(own),
                    last_run=f"{last.kind} {last.status} #{last.id}" if last else None,
                    partitions=current.partitions if current else p.partitions,
                    segments=segments,
                )
            )
    return found


def _segments(conn: cursor_rows.Conn, name: str, tenant: str | None) -> tuple[SegmentHealth, ...]:
    cursors = cursor_rows.segment_cursors(conn, name)
    leases = lease_rows.segment_leases(conn, name)
    found = []
    for k, cursor in sorted(cursors.items()):
        lease = leases.get(k)
        failures = failure_rows.open_failures(conn, segment_key(name, k))
        own = failures if tenant is None else [f for f in failures if f.tenant == tenant]
        owner = lease.owner if lease is not None and lease.alive else None
        found.append(SegmentHealth(k, cursor, owner, len(own)))
    return tuple(found)

"""Projection health: cursor, lag, state, owner, last run and open failures, per projection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eventstore import Cursor, EventStore
from eventstore.spi import wrap_exceptions
from projector import state
from projector.projection import Projection
from projector.rebuild import sweep_abandoned


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

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cursor"] = str(self.cursor)
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
    with wrap_exceptions(), store.pool.connection() as conn:
        if abandoned_after is not None:
            sweep_abandoned(conn, abandoned_after)
        for p in projections:
            current = state.get_cursor(conn, p.name)
            cursor = current.cursor if current else Cursor()
            lag = state.lag(conn, cursor, p.event_types)
            lease = state.lease_of(conn, p.name)
            failures = state.open_failures(conn, p.name)
            # A failure blocks every tenant's rows, so the state says "blocked" to all; the count (and
            # the failures an API lists) are the tenant's own.
            own = failures if tenant is None else [f for f in failures if f.tenant == tenant]
            runs = state.list_runs(conn, p.name, limit=5, tenant=tenant)
            active = {r.kind for r in runs if r.status == "running"}
            owner = lease.owner if lease and lease.alive else None
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
                )
            )
    return found

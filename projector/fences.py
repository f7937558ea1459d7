"""Tenant fences: a tenant's rows of a per-tenant projection are rebuilt while the projection goes on for
every other tenant.

Migration 0036 states the protocol and its guarantee. In short: `fence` (under the cursor row, for one
insert) makes the live batches leave the tenant's events; the rebuild replaces the tenant's rows, built to
the fence's cursor, holding no lock another tenant's batch needs; `lift` (under the cursor row again)
applies the tenant's own events the batches left and removes the fence. A live batch that meets a fence
whose run has ended lifts it itself, so a rebuild that died leaves no tenant behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from eventstore import Cursor, EventStore, RecordedEvent
from eventstore.spi import load_queries
from projector.projection import ApplyContext, Projection

Q = load_queries("projector", "fences.sql")
Conn = psycopg.Connection[Any]
Wanted = Callable[[RecordedEvent], bool]

#: Events read per page while a lift applies a tenant's skipped events.
_PAGE = 500


@dataclass(frozen=True)
class Fence:
    tenant: str
    run_id: int
    cursor: Cursor
    run_running: bool


def _fence(row: tuple[Any, ...]) -> Fence:
    tenant, run_id, tx, position, running = row
    return Fence(tenant, run_id, Cursor(tx, position), bool(running))


def fence(conn: Conn, projection: str, tenant: str, run_id: int, at: Cursor) -> None:
    """Inside the caller's transaction, which holds the cursor row (`state.lock_cursor`) standing at `at`."""
    conn.execute(
        Q["fence_tenant"],
        {
            "projection": projection,
            "tenant": tenant,
            "run_id": run_id,
            "cursor_tx": at.transaction_id,
            "cursor_position": at.position,
        },
    )


def fences_of(conn: Conn, projection: str) -> list[Fence]:
    """The projection's fences; read by a live batch after its compare-and-set of the cursor."""
    return [_fence(r) for r in conn.execute(Q["fences_of"], {"projection": projection}).fetchall()]


def lock_fence(conn: Conn, projection: str, tenant: str, run_id: int) -> Cursor:
    """The run's fence's cursor, locked until the caller's transaction ends."""
    row = conn.execute(
        Q["lock_fence"], {"projection": projection, "tenant": tenant, "run_id": run_id}
    ).fetchone()
    if row is None:
        raise LookupError(f"run {run_id} holds no fence on {tenant!r} of {projection!r}")
    return Cursor(row[0], row[1])


def move_fences(conn: Conn, projection: str, to: Cursor) -> None:
    conn.execute(
        Q["move_fences"],
        {"projection": projection, "cursor_tx": to.transaction_id, "cursor_position": to.position},
    )


def lock_fences(conn: Conn, projection: str) -> None:
    conn.execute(Q["lock_fences"], {"projection": projection})


def any_fence(conn: Conn, projection: str) -> bool:
    row = conn.execute(Q["any_fence"], {"projection": projection}).fetchone()
    return bool(row and row[0])


def lift(
    conn: Conn,
    store: EventStore,
    projection: Projection,
    fenced: Fence,
    until: Cursor,
    wanted: Wanted,
) -> int:
    """Inside the caller's transaction, which holds the cursor row standing at `until`: apply the fenced
    tenant's events after the fence's cursor up to `until` (those the live batches left) to its live rows,
    and remove the fence. Returns the events applied."""
    applied, after = 0, fenced.cursor
    while after < until:
        page = store.read_all(
            after, limit=_PAGE, tenant=fenced.tenant, types=projection.event_types, conn=conn
        )
        events = [e for e in page.events if e.cursor <= until]
        todo = [e for e in events if wanted(e)]
        if todo:
            projection.apply(ApplyContext(conn, projection.schema, projection.table_names), todo)
            applied += len(todo)
        if len(events) < len(page.events) or page.caught_up or not page.events:
            break
        after = events[-1].cursor
    conn.execute(
        Q["lift_fence"], {"projection": projection.name, "tenant": fenced.tenant, "run_id": fenced.run_id}
    )
    return applied

"""Tenant fences: a tenant's rows of a per-tenant projection are rebuilt while the projection goes on for
every other tenant.

Migration 0036 states the protocol and its guarantee. In short: `fence` (under the cursor row, for one
insert) makes the live batches leave the tenant's events; the rebuild replaces the tenant's rows, built to
the fence's cursor, holding no lock another tenant's batch needs; `lift` (under the cursor row again)
applies the tenant's own events the batches left and removes the fence. A live batch that meets a fence
whose run has ended lifts it itself, so a rebuild that died leaves no tenant behind.

A fence is kept per cursor row: a partitioned projection's tenant has one fence per segment, under the
segment's key and at its cursor (`projector.tenant_rebuild` says why), and each is lifted with its
segment's events alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from eventstore import Cursor, EventStore, RecordedEvent
from eventstore.spi import fetch_all, fetch_value, load_queries
from projector.projection import ApplyContext, Projection
from projector.segments import Unit

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


def _fence(*, tenant: str, run_id: int, cursor_tx: int, cursor_position: int, running: bool) -> Fence:
    """A row of fences_of."""
    return Fence(tenant, run_id, Cursor(cursor_tx, cursor_position), running)


def _keyed_cursor(*, projection: str, cursor_tx: int, cursor_position: int) -> tuple[str, Cursor]:
    """A row of lock_run_fences: the fence's key and its cursor."""
    return projection, Cursor(cursor_tx, cursor_position)


def _tenant_run(*, tenant: str, run_id: int) -> tuple[str, int]:
    """A row of take_fences."""
    return tenant, run_id


def fence(conn: Conn, key: str, tenant: str, run_id: int, at: Cursor) -> None:
    """Inside the caller's transaction, which holds the cursor row of `key` (a projection's, or a
    segment's) standing at `at`."""
    conn.execute(
        Q["fence_tenant"],
        {
            "key": key,
            "tenant": tenant,
            "run_id": run_id,
            "cursor_tx": at.transaction_id,
            "cursor_position": at.position,
        },
    )


def fences_of(conn: Conn, key: str) -> list[Fence]:
    """The fences of `key` (a projection's or a segment's); read by a live batch after its compare-and-set
    of that key's cursor."""
    return fetch_all(conn, _fence, Q["fences_of"], {"key": key})


def lock_run_fences(conn: Conn, projection: str, tenant: str, run_id: int) -> dict[str, Cursor]:
    """The run's fences on `tenant` (one per cursor row: the projection's, or each segment's), by key,
    with their cursors, locked until the caller's transaction ends; empty if it holds none."""
    params = {"projection": projection, "tenant": tenant, "run_id": run_id}
    return dict(fetch_all(conn, _keyed_cursor, Q["lock_run_fences"], params))


def reset_fences(conn: Conn, projection: str, keys: list[str], to: Cursor) -> None:
    """Inside a swap of the whole projection, which has put every tenant's rows at `to` with the cursor
    rows `keys` (the projection's, or each segment's of the number of partitions built): each fenced
    tenant's rows stand at `to` too, so its fences are put there, one per key. (Were the number of
    partitions changed, the replacement finds other fences than it set, and fails; the live batches then
    lift them, each segment's from `to`.)"""
    taken = set(fetch_all(conn, _tenant_run, Q["take_fences"], {"projection": projection}))
    for tenant, run_id in sorted(taken):
        for key in keys:
            fence(conn, key, tenant, run_id, to)


def lock_fences(conn: Conn, projection: str) -> None:
    conn.execute(Q["lock_fences"], {"projection": projection})


def any_fence(conn: Conn, projection: str) -> bool:
    return bool(fetch_value(conn, Q["any_fence"], {"projection": projection}))


def lift(
    conn: Conn,
    store: EventStore,
    projection: Projection,
    unit: Unit,
    fenced: Fence,
    until: Cursor,
    wanted: Wanted,
) -> int:
    """Inside the caller's transaction, which holds the cursor row of `unit` standing at `until`: apply
    the fenced tenant's events of `unit` (all of them, or one segment's streams') after the fence's cursor
    up to `until` (those the live batches left) to its live rows, and remove the fence. Returns the events
    applied."""
    applied, after = 0, fenced.cursor
    while after < until:
        page = store.read_all(
            after,
            limit=_PAGE,
            tenant=fenced.tenant,
            types=projection.event_types,
            conn=conn,
            segment=unit.read_segment,
        )
        if not page.events and not page.caught_up:
            # The transaction at the horizon ended while the page was read: read again. (Taken for the
            # end, this lifted the fence with the tenant's skipped events unapplied.)
            continue
        events = [e for e in page.events if e.cursor <= until]
        todo = [e for e in events if wanted(e)]
        if todo:
            projection.apply(ApplyContext(conn, projection.schema, projection.table_names), todo)
            applied += len(todo)
        if len(events) < len(page.events) or page.caught_up or not events:
            break
        after = events[-1].cursor
    conn.execute(Q["lift_fence"], {"key": unit.key, "tenant": fenced.tenant, "run_id": fenced.run_id})
    return applied

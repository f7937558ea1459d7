"""Verify: build a scratch copy up to the live cursor and compare digests at the same cursor, naming the
rows that differ (of one tenant's rows, with a tenant). The final step locks the projection's cursor
row, so both copies stand at the same cursor while the live worker pauses for that moment only.
"""

from __future__ import annotations

import time

import structlog

from eventstore import Cursor, EventStore
from projector import cursor_rows, fences, run_rows, tables
from projector.digest import differing_rows, projection_digest
from projector.operator_runs import PendingRun, VerifyResult, check_scope, live_cursor_of, pending_run
from projector.projection import Projection
from projector.segments import check_partitions
from projector.shadow import Progress, ShadowBuild

log = structlog.get_logger(__name__)


def start_verify(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    tenant: str | None = None,
    batch_size: int = 1000,
) -> PendingRun:
    """Record a verify run; execute() builds a scratch copy and compares digests at the live cursor."""
    check_scope(projection, tenant)
    return pending_run(
        store,
        projection,
        "verify",
        trigger="operator",
        actor=actor,
        tenant=tenant,
        start=Cursor(),
        target=live_cursor_of(store, projection),
        work=lambda run_id, progress: _verify(store, projection, run_id, tenant, batch_size, progress),
    )


def _verify(
    store: EventStore,
    projection: Projection,
    run_id: int,
    tenant: str | None,
    batch_size: int,
    progress: Progress | None,
) -> VerifyResult:
    schema = tables.verify_schema(projection, run_id)
    with store.pool.connection() as conn, conn.transaction():
        tables.recreate_schema(conn, projection, schema)
    build = ShadowBuild(store, projection, schema, run_id, batch_size, tenant=tenant)
    build.run_until(live_cursor_of(store, projection), progress)
    _wait_for_tenant_rebuilds(store, projection, tenant)
    with store.pool.connection() as conn, conn.transaction():
        # The live cursor only moves forward under this lock (a replay or swap takes it too), and the
        # build never passes the target it is given, so both copies now stand at `live_cursor`.
        live_cursor, _ = cursor_rows.lock_cursor(conn, projection.name)
        floor = live_cursor
        if projection.partitions > 1:
            stored = cursor_rows.get_cursor(conn, projection.name)
            assert stored is not None
            check_partitions(projection, stored)
            # Each segment stands at its own cursor: the copy takes each stream's events up to its
            # segment's, so both copies hold the same events.
            segments = cursor_rows.lock_segment_cursors(conn, projection.name)
            floor, live_cursor = min(segments.values()), max(segments.values())
            build.limit_to(segments, projection.partitions)
        if build.cursor > floor:  # a replay moved the live cursor back meanwhile
            tables.recreate_schema(conn, projection, schema)
            build.cursor, build.events = Cursor(), 0
        build.run_until(live_cursor, progress, conn)
        live_digest = projection_digest(conn, projection, projection.schema, tenant=tenant)
        rebuilt_digest = projection_digest(conn, projection, schema, tenant=tenant)
        differences = (
            []
            if live_digest == rebuilt_digest
            else differing_rows(conn, projection, projection.schema, schema, tenant=tenant)
        )
    with store.pool.connection() as conn:
        tables.drop_schema(conn, schema)
        error = (
            None
            if live_digest == rebuilt_digest
            else (
                f"digest mismatch at {live_cursor}: "
                f"live {live_digest[:12]}, rebuilt {rebuilt_digest[:12]}; "
                f"{sum(len(d.only_in_live) + len(d.only_in_rebuilt) for d in differences)} rows differ"
            )
        )
        run_rows.finish_run(
            conn, run_id, "completed" if error is None else "failed", error=error, digest=live_digest
        )
    return VerifyResult(run_id, live_cursor, live_digest, rebuilt_digest, differences)


def _wait_for_tenant_rebuilds(store: EventStore, projection: Projection, tenant: str | None) -> None:
    """A verify of every tenant waits while a tenant's rows are being replaced (fenced, they lag the
    cursor for that moment, and would show as a difference). Fences last seconds: after a minute of them
    the verify goes on, and a difference it reports is real or that lag."""
    if tenant is not None or not projection.per_tenant:
        return
    deadline, pause = time.monotonic() + 60, 0.05
    while time.monotonic() < deadline:
        with store.pool.connection() as conn:
            if not fences.any_fence(conn, projection.name):
                return
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
    log.warning("projection_verify_past_fences", projection=projection.name)


def verify(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    tenant: str | None = None,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> VerifyResult:
    """Rebuild `projection` in a scratch schema and compare it with the live tables at the same cursor."""
    run = start_verify(store, projection, actor=actor, tenant=tenant, batch_size=batch_size)
    result = run.execute(progress)
    assert isinstance(result, VerifyResult)
    return result

"""The last step of rebuilding one tenant's rows of a per-tenant projection: fence, replace, lift.

The other tenants' events go on being applied throughout (migration 0036 states the guarantee): the
projection's cursor rows are held only to set the fence and, at the end, to apply the tenant's own events
that arrived meanwhile.

A partitioned projection (`projector.segments`) has no single cursor: each segment's batches move its own,
under its own row lock. So the fence is per cursor row, one mechanism for both kinds:

- Fence: one transaction locks the projection's row and then every segment's row (a swap's order; a batch
  holds one segment's row, so a batch in flight commits first) and records one fence per segment, under
  the segment's key and at that segment's cursor. Each segment's later batches see their fence after their
  compare-and-set, and leave the tenant's events.
- Replace: the scratch copy of the tenant's rows takes each stream's events up to its segment's fence
  cursor (`ShadowBuild.limit_to`, as a verify of a partitioned projection compares at each segment's
  cursor): exactly what the tenant's live rows hold. It replaces them under the fences' row locks.
- Lift: locking the cursor rows again in the same order, each segment applies the tenant's events of its
  own streams after its fence's cursor up to its cursor now, and its fence is deleted. A segment batch
  that meets a fence of a run that died lifts its own segment's fence alone, under its own row: the
  segments' parts are disjoint, so no event is applied by two of them, nor missed.

An unpartitioned projection is the case of one unit, under the projection's own key.
"""

from __future__ import annotations

import structlog

from eventstore import Cursor, EventStore
from projector import fences, run_rows, tables
from projector.digest import projection_digest
from projector.errors import wrap_exceptions
from projector.projection import Projection
from projector.segments import Unit, lock_unit_cursors, split_key
from projector.shadow import Progress, ShadowBuild

log = structlog.get_logger(__name__)


def replace_tenant_rows(
    store: EventStore,
    projection: Projection,
    build: ShadowBuild,
    run_id: int,
    tenant: str,
    progress: Progress | None,
) -> tuple[Cursor, str]:
    """Replace `tenant`'s live rows by the scratch copy `build` (of that tenant's events alone); return the
    cursor the copy was built to (of a partitioned projection: its highest segment's) and the digest of the
    tenant's rows there. Completes the run."""
    name = projection.name
    with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
        # A batch in flight commits first; no later one applies the tenant's events.
        held = lock_unit_cursors(conn, projection)
        for key, at in held.items():
            fences.fence(conn, key, tenant, run_id, at)
    log.info(
        "projection_tenant_fenced",
        projection=name,
        tenant=tenant,
        run_id=run_id,
        cursor=str(min(held.values())),
    )
    try:
        with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
            # The fences' cursors, not the live ones: the tenant's live rows stand there. (A swap of the
            # whole projection meanwhile moves them forward, and waits for this transaction.)
            fenced = fences.lock_run_fences(conn, name, tenant, run_id)
            if fenced.keys() != held.keys():
                # Taken for abandoned (no heartbeat), its fences were lifted by the live batches.
                raise LookupError(f"run {run_id} no longer holds its fences on {tenant!r} of {name!r}")
            if projection.partitions > 1:
                build.limit_to({_segment(key): at for key, at in fenced.items()}, projection.partitions)
            floor, at = min(fenced.values()), max(fenced.values())
            if build.cursor > floor:
                # The scratch copy read past a fence (a replay moved the cursor back): start again below.
                tables.recreate_schema(conn, projection, build.schema)
                build.cursor, build.events = Cursor(), 0
            build.run_until(at, progress, conn)
            tables.replace_tenant_rows(conn, projection, build.schema, tenant)
            tables.drop_schema(conn, build.schema)
            digest = projection_digest(conn, projection, projection.schema, tenant=tenant)
            run_rows.run_progress(conn, run_id, at, 0)
        with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
            caught_up = _lift(conn, store, projection, build, run_id, tenant)
            run_rows.finish_run(conn, run_id, "completed", digest=digest)
    except BaseException:
        _lift_after_failure(store, projection, build, run_id, tenant)
        raise
    log.info(
        "projection_tenant_fence_lifted",
        projection=name,
        tenant=tenant,
        run_id=run_id,
        applied=caught_up,
    )
    return at, digest


def _segment(key: str) -> int:
    segment = split_key(key)[1]
    assert segment is not None, f"{key!r} is not a segment's key"
    return segment


def _lift(
    conn: run_rows.Conn,
    store: EventStore,
    projection: Projection,
    build: ShadowBuild,
    run_id: int,
    tenant: str,
) -> int:
    """Inside the caller's transaction: lock the cursor rows, then the run's fences, and lift each (the
    tenant's events after its cursor up to its unit's cursor now). Returns the events applied."""
    live = lock_unit_cursors(conn, projection)
    applied = 0
    for key, at in fences.lock_run_fences(conn, projection.name, tenant, run_id).items():
        unit = Unit(projection, split_key(key)[1])
        fenced = fences.Fence(tenant, run_id, at, True)
        # `kept`, not `wanted`: the copy's limits stop at the fences, the lift starts there.
        applied += fences.lift(conn, store, projection, unit, fenced, live[key], build.kept)
    return applied


def _lift_after_failure(
    store: EventStore, projection: Projection, build: ShadowBuild, run_id: int, tenant: str
) -> None:
    """The tenant's rows stand at the fences' cursors whether or not they were replaced: catch them up and
    lift the fences now. If the database is gone too, the first live batch (of each segment) once the run
    is closed does."""
    try:
        with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
            _lift(conn, store, projection, build, run_id, tenant)
    except Exception as exc:
        log.warning("projection_tenant_fence_left", projection=projection.name, run_id=run_id, error=str(exc))

"""The last step of rebuilding one tenant's rows of a per-tenant projection: fence, replace, lift.

The other tenants' events go on being applied throughout (migration 0036 states the guarantee): the
projection's cursor row is held only to set the fence and, at the end, to apply the tenant's own events
that arrived meanwhile.
"""

from __future__ import annotations

import structlog

from eventstore import Cursor, EventStore
from projector import bookkeeping, fences, tables
from projector.digest import projection_digest
from projector.errors import wrap_exceptions
from projector.projection import Projection
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
    cursor the copy was built to and the digest of the tenant's rows there. Completes the run."""
    name = projection.name
    with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
        at, _ = bookkeeping.lock_cursor(
            conn, name
        )  # a batch in flight commits first; no later one applies tenant
        fences.fence(conn, name, tenant, run_id, at)
    log.info("projection_tenant_fenced", projection=name, tenant=tenant, run_id=run_id, cursor=str(at))
    try:
        with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
            # The fence's cursor, not the live one: the tenant's live rows stand there. (A swap of the whole
            # projection meanwhile moves it forward, and waits for this transaction.)
            at = fences.lock_fence(conn, name, tenant, run_id)
            if build.cursor > at:
                # The scratch copy read past the fence (a replay moved the cursor back): start again below.
                tables.recreate_schema(conn, projection, build.schema)
                build.cursor, build.events = Cursor(), 0
            build.run_until(at, progress, conn)
            tables.replace_tenant_rows(conn, projection, build.schema, tenant)
            tables.drop_schema(conn, build.schema)
            digest = projection_digest(conn, projection, projection.schema, tenant=tenant)
            bookkeeping.run_progress(conn, run_id, at, 0)
        with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
            live, _ = bookkeeping.lock_cursor(conn, name)
            fenced = fences.Fence(tenant, run_id, fences.lock_fence(conn, name, tenant, run_id), True)
            caught_up = fences.lift(conn, store, projection, fenced, live, build.wanted)
            bookkeeping.finish_run(conn, run_id, "completed", digest=digest)
    except BaseException:
        _lift_after_failure(store, projection, build, run_id, tenant)
        raise
    log.info(
        "projection_tenant_fence_lifted",
        projection=name,
        tenant=tenant,
        run_id=run_id,
        applied=caught_up,
        cursor=str(live),
    )
    return at, digest


def _lift_after_failure(
    store: EventStore, projection: Projection, build: ShadowBuild, run_id: int, tenant: str
) -> None:
    """The tenant's rows stand at the fence's cursor whether or not they were replaced: catch them up and
    lift the fence now. If the database is gone too, the first live batch once the run is closed does."""
    try:
        with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
            live, _ = bookkeeping.lock_cursor(conn, projection.name)
            held = fences.lock_fence(conn, projection.name, tenant, run_id)
            fenced = fences.Fence(tenant, run_id, held, True)
            fences.lift(conn, store, projection, fenced, live, build.wanted)
    except Exception as exc:
        log.warning("projection_tenant_fence_left", projection=projection.name, run_id=run_id, error=str(exc))

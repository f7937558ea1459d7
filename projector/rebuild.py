"""Rebuild: build the projection from the start of the log into a shadow schema, catch up with the live
cursor, then swap the shadow tables in atomically, with the cursor, in one transaction. The final step
locks the projection's cursor row, so the live worker pauses for that moment only.

With a tenant, a per-tenant projection's rows of that tenant alone are rebuilt: the shadow holds only
that tenant's rows, and they replace the live ones behind a fence on that tenant
(`projector.tenant_rebuild`; of a partitioned projection, one fence per segment, at its cursor).
"""

from __future__ import annotations

import structlog
import tenacity

from eventstore import ConflictError, Cursor, EventStore
from projector import cursor_rows, fences, run_rows, tables
from projector.digest import projection_digest
from projector.errors import TablesBusyError, wrap_exceptions
from projector.operator_runs import (
    PendingRun,
    RebuildResult,
    check_scope,
    live_cursor_of,
    pending_run,
)
from projector.projection import Projection
from projector.segments import units_of
from projector.shadow import Progress, ShadowBuild
from projector.tenant_rebuild import replace_tenant_rows

log = structlog.get_logger(__name__)

_SWAP_LOCK_TIMEOUT_MS = 100  # well below PostgreSQL's default deadlock_timeout of 1 s

_SWAP_ATTEMPTS = 100


def start_rebuild(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    trigger: str = "operator",
    tenant: str | None = None,
    batch_size: int = 1000,
    note: str | None = None,
) -> PendingRun:
    """Record a rebuild run of `projection` (of one tenant's rows, with `tenant`); execute() builds it."""
    check_scope(projection, tenant)
    return pending_run(
        store,
        projection,
        "rebuild",
        trigger=trigger,
        actor=actor,
        tenant=tenant,
        start=Cursor(),
        target=live_cursor_of(store, projection),
        work=lambda run_id, progress: _rebuild(store, projection, run_id, tenant, batch_size, progress),
        note=note,
    )


def _rebuild(
    store: EventStore,
    projection: Projection,
    run_id: int,
    tenant: str | None,
    batch_size: int,
    progress: Progress | None,
) -> RebuildResult:
    schema = tables.shadow_schema(projection, run_id)
    log.info("projection_rebuild_started", projection=projection.name, run_id=run_id, tenant=tenant)
    with store.pool.connection() as conn, conn.transaction():
        tables.recreate_schema(conn, projection, schema)
    build = ShadowBuild(store, projection, schema, run_id, batch_size, tenant=tenant)
    # Most of the work happens while the live projection keeps going (a tenant's copy stops at the live
    # cursor, where it must meet the other tenants' rows)...
    build.run_until(None if tenant is None else live_cursor_of(store, projection), progress)
    # ...then, holding the cursor row, the shadow closes the last gap and takes the live tables' place.
    if tenant is None:
        final, digest = _swap_with_retries(store, projection, build, run_id, progress)
    else:
        final, digest = replace_tenant_rows(store, projection, build, run_id, tenant, progress)
    log.info(
        "projection_rebuilt",
        projection=projection.name,
        run_id=run_id,
        tenant=tenant,
        events=build.events,
        digest=digest,
    )
    return RebuildResult(run_id, final, build.events, digest)


def _swap_with_retries(
    store: EventStore, projection: Projection, build: ShadowBuild, run_id: int, progress: Progress | None
) -> tuple[Cursor, str]:
    """The swap transaction, retried with backoff while readers hold the live tables (see
    `tables.lock_live_tables`)."""

    def waiting(retry: tenacity.RetryCallState) -> None:
        log.info(
            "projection_swap_waiting_for_readers", projection=projection.name, attempt=retry.attempt_number
        )

    try:
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TablesBusyError),
            stop=tenacity.stop_after_attempt(_SWAP_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=0.01, max=0.5),
            before_sleep=waiting,
        ):
            with attempt:
                saved = (build.cursor, build.events)
                try:
                    return _swap(store, projection, build, run_id, progress)
                except TablesBusyError:
                    build.cursor, build.events = saved  # the rolled-back catch-up is done again next time
                    raise
    except tenacity.RetryError:
        pass
    raise ConflictError(
        f"could not swap in the rebuilt {projection.name!r}: readers kept its tables busy for "
        f"{_SWAP_ATTEMPTS} attempts; retry when the load is lower"
    )


def _swap(
    store: EventStore, projection: Projection, build: ShadowBuild, run_id: int, progress: Progress | None
) -> tuple[Cursor, str]:
    with wrap_exceptions(), store.pool.connection() as conn, conn.transaction():
        # Cursor row first, tables second: the same order as a live batch, so the two queue. A partitioned
        # projection's segment rows come right after its own, in segment order (each batch holds one).
        live_cursor, _ = cursor_rows.lock_cursor(conn, projection.name)
        segments = cursor_rows.lock_segment_cursors(conn, projection.name)
        live_cursor = max([live_cursor, *segments.values()])
        fences.lock_fences(conn, projection.name)
        tables.lock_live_tables(conn, projection, _SWAP_LOCK_TIMEOUT_MS)
        build.run_until(None, progress, conn)
        final = max(build.cursor, live_cursor)
        tables.swap_in_shadow(conn, projection, build.schema)
        cursor_rows.set_cursor(conn, projection.name, final, projection.version)
        # The tables now hold every segment's streams up to `final`, under the code's number of partitions.
        cursor_rows.set_partitions(conn, projection.name, projection.partitions)
        if segments or projection.partitions > 1:
            wanted = projection.partitions if projection.partitions > 1 else 0
            cursor_rows.reset_segments(conn, projection.name, wanted, final, projection.version)
        # A tenant being rebuilt meanwhile now has its rows at `final` too (its replacement builds on to it).
        fences.reset_fences(conn, projection.name, [u.key for u in units_of(projection)], final)
        digest = projection_digest(conn, projection, projection.schema)
        run_rows.run_progress(conn, run_id, final, 0)
        run_rows.finish_run(conn, run_id, "completed", digest=digest)
    return final, digest


def rebuild(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    trigger: str = "operator",
    tenant: str | None = None,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> RebuildResult:
    """Rebuild `projection` from the whole log in the shadow and swap it in atomically."""
    run = start_rebuild(store, projection, actor=actor, trigger=trigger, tenant=tenant, batch_size=batch_size)
    result = run.execute(progress)
    assert isinstance(result, RebuildResult)
    return result

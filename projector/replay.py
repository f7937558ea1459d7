"""Replay: for a projection that declares `replay_in_place`, move the cursor back; the worker holding the
lease re-applies from there and completes the run. Any other projection (or one tenant's rows) is
rebuilt instead (`projector.rebuild`), which gives the state a correct replay would give.
"""

from __future__ import annotations

from datetime import datetime

import structlog

from eventstore import Cursor, EventStore, InvalidInputError, NotFoundError
from projector import cursor_rows
from projector.errors import wrap_exceptions
from projector.operator_runs import (
    PendingRun,
    ReplayResult,
    check_scope,
    live_cursor_of,
    pending_run,
)
from projector.projection import Projection
from projector.rebuild import start_rebuild
from projector.shadow import Progress

log = structlog.get_logger(__name__)


def start_replay(
    store: EventStore,
    projection: Projection,
    *,
    after: Cursor | None = None,
    since: datetime | None = None,
    actor: str | None = None,
    tenant: str | None = None,
    batch_size: int = 1000,
) -> PendingRun:
    """Record a replay of the events after `after` (or recorded since `since`).

    In place when the projection allows it and no tenant is named; otherwise a rebuild, whose result is
    what any correct replay followed by catching up must give."""
    if (after is None) == (since is None):
        raise InvalidInputError("replay needs exactly one of a cursor (--after) or a time (--since)")
    check_scope(projection, tenant)
    if tenant is not None:
        # One tenant's rows are always rebuilt whole. (Nothing is looked up in the log first: where other
        # tenants' events lie is not this caller's to learn.)
        note = f"the rows of tenant {tenant!r} are rebuilt from the start of the log, as a replay leaves them"
        return start_rebuild(
            store, projection, actor=actor, trigger="replay", tenant=tenant, batch_size=batch_size, note=note
        )
    if since is not None:
        with wrap_exceptions(), store.pool.connection() as conn:
            after = cursor_rows.first_cursor_since(conn, since)
        if after is None:
            raise NotFoundError(f"no event was recorded at or after {since.isoformat()}; nothing to replay")
    assert after is not None
    live = live_cursor_of(store, projection, highest=True)
    if after >= live:
        raise InvalidInputError(
            f"cursor {after} is not behind the projection's cursor {live}; nothing to replay"
        )
    if not projection.replay_in_place or projection.partitions > 1:
        why = "is partitioned" if projection.replay_in_place else "cannot be replayed in place"
        note = (
            f"{projection.name!r} {why}: rebuilt from the start of the log instead, "
            "which gives the state a replay would"
        )
        return start_rebuild(
            store, projection, actor=actor, trigger="replay", batch_size=batch_size, note=note
        )
    return pending_run(
        store,
        projection,
        "replay",
        trigger="operator",
        actor=actor,
        tenant=None,
        start=after,
        target=live,
        work=lambda run_id, _progress: _replay_in_place(store, projection, run_id, after),
    )


def _replay_in_place(store: EventStore, projection: Projection, run_id: int, after: Cursor) -> ReplayResult:
    with store.pool.connection() as conn, conn.transaction():
        current, version = cursor_rows.lock_cursor(conn, projection.name)
        cursor_rows.set_cursor(conn, projection.name, after, version)
    # Wake the workers now: the lease holder notices the moved cursor and re-applies at once, instead of
    # waiting for the next append.
    store.notify_appended()
    log.info(
        "projection_replay_requested",
        projection=projection.name,
        run_id=run_id,
        after=str(after),
        until=str(current),
    )
    return ReplayResult(run_id, after, current)


def replay(
    store: EventStore,
    projection: Projection,
    *,
    after: Cursor | None = None,
    since: datetime | None = None,
    actor: str | None = None,
    tenant: str | None = None,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> int:
    """Replay events after `after` (or recorded since `since`); returns the run id. An in-place replay
    is completed by the live worker; any other is a rebuild, done before this returns."""
    run = start_replay(
        store, projection, after=after, since=since, actor=actor, tenant=tenant, batch_size=batch_size
    )
    run.execute(progress)
    return run.run_id

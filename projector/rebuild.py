"""Rebuild, verify and replay: the operator's tools for a projection.

- rebuild: build the projection from the start of the log into a shadow schema, catch up with the live
  cursor, then swap the shadow tables in atomically, with the cursor, in one transaction.
- verify: build a shadow copy up to the live cursor and compare digests at the same cursor, naming the
  rows that differ.
- replay: move the cursor back to a given cursor or time; the worker holding the lease re-applies from
  there (handlers must be idempotent over the replayed range, e.g. upserts).

Every one of them is recorded as a run. The final step of rebuild and verify locks the projection's
cursor row, so the live worker pauses for that moment only and both copies stand at the same cursor.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
import structlog

from eventstore import ConflictError, Cursor, EventStore, InvalidInputError, RecordedEvent
from eventstore.errors import NotFoundError
from projector import state, tables
from projector.digest import TableDifference, differing_rows, projection_digest
from projector.projection import ApplyContext, Projection

log = structlog.get_logger(__name__)

_SWAP_LOCK_TIMEOUT_MS = 100  # well below PostgreSQL's default deadlock_timeout of 1 s
_SWAP_ATTEMPTS = 100

#: Called after every shadow batch with (events processed so far, shadow cursor, target cursor).
Progress = Callable[[int, Cursor, Cursor], None]


def default_actor() -> str:
    return f"{os.environ.get('USER', 'unknown')}@{socket.gethostname()}"


@dataclass(frozen=True)
class RebuildResult:
    run_id: int
    cursor: Cursor
    events: int
    digest: str


@dataclass(frozen=True)
class VerifyResult:
    run_id: int
    cursor: Cursor
    live_digest: str
    rebuilt_digest: str
    differences: list[TableDifference]

    @property
    def equal(self) -> bool:
        return self.live_digest == self.rebuilt_digest


class _ShadowBuild:
    """Applies the log, in order, to a projection's tables in a shadow schema."""

    def __init__(self, store: EventStore, projection: Projection, schema: str, run_id: int, batch_size: int):
        self.store, self.projection, self.schema = store, projection, schema
        self.run_id, self.batch_size = run_id, batch_size
        self.cursor = Cursor()
        self.events = 0
        with store.pool.connection() as conn:
            self._skipped = state.skipped_positions(conn, projection.name)
            failures = state.open_failures(conn, projection.name)
        # Streams the live projection has parked stay parked here too, so both copies agree.
        self._parked = {(f.tenant, f.stream_id): f.stream_version for f in failures if f.policy == "park"}

    def _wanted(self, e: RecordedEvent) -> bool:
        parked_at = self._parked.get((e.tenant, e.stream_id))
        return e.position not in self._skipped and (parked_at is None or e.stream_version < parked_at)

    def run_until(
        self, target: Cursor | None, progress: Progress | None, conn: psycopg.Connection[Any] | None = None
    ) -> None:
        """Apply every event up to and including `target` (None: everything readable now); in `conn`'s
        transaction if given."""
        while target is None or self.cursor < target:
            page = self.store.read_all(
                self.cursor, limit=self.batch_size, types=self.projection.event_types, conn=conn
            )
            events = [e for e in page.events if target is None or e.cursor <= target]
            if len(events) < len(page.events) or page.caught_up:
                # Past the target, or everything readable is read: the shadow stands at the end.
                end = (
                    max(page.cursor, self.cursor)
                    if target is None
                    else min(max(page.cursor, self.cursor), target)
                )
            else:
                end = events[-1].cursor
            if not events and end <= self.cursor:
                break
            self._apply(events, end, conn)
            if progress is not None:
                progress(self.events, self.cursor, target or end)
            if target is None and page.caught_up:
                break

    def _apply(
        self, events: Sequence[RecordedEvent], end: Cursor, conn: psycopg.Connection[Any] | None
    ) -> None:
        wanted = [e for e in events if self._wanted(e)]
        if conn is not None:
            self._apply_in(conn, wanted, end, len(events))
        else:
            with self.store.pool.connection() as own, own.transaction():
                self._apply_in(own, wanted, end, len(events))
        self.cursor = max(self.cursor, end)
        self.events += len(events)

    def _apply_in(
        self, conn: psycopg.Connection[Any], events: list[RecordedEvent], end: Cursor, n: int
    ) -> None:
        if events:
            self.projection.apply(ApplyContext(conn, self.schema, self.projection.table_names), events)
        state.run_progress(conn, self.run_id, end, n)


def _start_run(
    store: EventStore,
    projection: Projection,
    kind: state.RunKind,
    *,
    trigger: str,
    actor: str,
    start: Cursor,
    target: Cursor | None = None,
) -> int:
    with store.pool.connection() as conn:
        state.ensure_cursor(conn, projection.name, projection.version)
        try:
            return state.start_run(
                conn,
                projection.name,
                kind,
                trigger=trigger,
                actor=actor,
                owner=f"{socket.gethostname()}:{os.getpid()}",
                start=start,
                target=target,
            )
        except psycopg.errors.UniqueViolation:
            running = state.active_run(conn, projection.name, "rebuild") or state.active_run(
                conn, projection.name, "replay"
            )
            which = f" (run {running[0]})" if running else ""
            raise ConflictError(
                f"a rebuild or replay of {projection.name!r} is already running{which}; "
                "wait for it, or check `ledgerflow projections runs`"
            ) from None


def _live_cursor(store: EventStore, projection: Projection) -> Cursor:
    with store.pool.connection() as conn:
        current = state.get_cursor(conn, projection.name)
    return current.cursor if current else Cursor()


def rebuild(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    trigger: str = "operator",
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> RebuildResult:
    """Rebuild `projection` from the whole log in the shadow and swap it in atomically."""
    run_id = _start_run(
        store,
        projection,
        "rebuild",
        trigger=trigger,
        actor=actor or default_actor(),
        start=Cursor(),
        target=_live_cursor(store, projection),
    )
    schema = tables.shadow_schema(projection)
    log.info("projection_rebuild_started", projection=projection.name, run_id=run_id)
    try:
        with store.pool.connection() as conn, conn.transaction():
            tables.recreate_schema(conn, projection, schema)
        build = _ShadowBuild(store, projection, schema, run_id, batch_size)
        # Most of the work happens while the live projection keeps going...
        build.run_until(None, progress)
        # ...then, holding the cursor row, the shadow closes the last gap and takes the live tables' place.
        final, digest = _swap_with_retries(store, projection, build, run_id, progress)
    except BaseException as exc:
        _fail_run(store, run_id, exc, schema)
        raise
    log.info(
        "projection_rebuilt", projection=projection.name, run_id=run_id, events=build.events, digest=digest
    )
    return RebuildResult(run_id, final, build.events, digest)


def _swap_with_retries(
    store: EventStore, projection: Projection, build: _ShadowBuild, run_id: int, progress: Progress | None
) -> tuple[Cursor, str]:
    """The swap transaction, retried while readers hold the live tables (see `tables.lock_live_tables`)."""
    for attempt in range(_SWAP_ATTEMPTS):
        saved = (build.cursor, build.events)
        try:
            with store.pool.connection() as conn, conn.transaction():
                # Cursor row first, tables second: the same order as a live batch, so the two queue.
                live_cursor, _ = state.lock_cursor(conn, projection.name)
                tables.lock_live_tables(conn, projection, _SWAP_LOCK_TIMEOUT_MS)
                build.run_until(None, progress, conn)
                final = max(build.cursor, live_cursor)
                tables.swap_in_shadow(conn, projection)
                state.set_cursor(conn, projection.name, final, projection.version)
                digest = projection_digest(conn, projection, projection.schema)
                state.run_progress(conn, run_id, final, 0)
                state.finish_run(conn, run_id, "completed", digest=digest)
            return final, digest
        except psycopg.errors.LockNotAvailable:
            build.cursor, build.events = saved  # the rolled-back catch-up is done again next time
            log.info("projection_swap_waiting_for_readers", projection=projection.name, attempt=attempt + 1)
            threading.Event().wait(min(0.01 * 2**attempt, 0.5))
    raise ConflictError(
        f"could not swap in the rebuilt {projection.name!r}: readers kept its tables busy for "
        f"{_SWAP_ATTEMPTS} attempts; retry when the load is lower"
    )


def verify(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> VerifyResult:
    """Rebuild `projection` in a scratch schema and compare it with the live tables at the same cursor."""
    run_id = _start_run(
        store,
        projection,
        "verify",
        trigger="operator",
        actor=actor or default_actor(),
        start=Cursor(),
        target=_live_cursor(store, projection),
    )
    schema = tables.verify_schema(projection)
    try:
        with store.pool.connection() as conn, conn.transaction():
            tables.recreate_schema(conn, projection, schema)
        build = _ShadowBuild(store, projection, schema, run_id, batch_size)
        build.run_until(_live_cursor(store, projection), progress)
        with store.pool.connection() as conn, conn.transaction():
            live_cursor, _ = state.lock_cursor(conn, projection.name)
            build.run_until(live_cursor, progress, conn)
            if build.cursor > live_cursor:
                raise InvalidInputError("the verify copy went past the live cursor; run verify again")
            live_digest = projection_digest(conn, projection, projection.schema)
            rebuilt_digest = projection_digest(conn, projection, schema)
            differences = (
                []
                if live_digest == rebuilt_digest
                else differing_rows(conn, projection, projection.schema, schema)
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
            state.finish_run(
                conn, run_id, "completed" if error is None else "failed", error=error, digest=live_digest
            )
    except BaseException as exc:
        _fail_run(store, run_id, exc, schema)
        raise
    return VerifyResult(run_id, live_cursor, live_digest, rebuilt_digest, differences)


def replay(
    store: EventStore,
    projection: Projection,
    *,
    after: Cursor | None = None,
    since: datetime | None = None,
    actor: str | None = None,
) -> int:
    """Move the projection's cursor back so the live worker re-applies events after `after` (or those
    recorded since `since`). Returns the run id; the worker completes the run when it is back."""
    if (after is None) == (since is None):
        raise InvalidInputError("replay needs exactly one of a cursor (--after) or a time (--since)")
    with store.pool.connection() as conn:
        if since is not None:
            after = state.first_cursor_since(conn, since)
            if after is None:
                raise NotFoundError(
                    f"no event was recorded at or after {since.isoformat()}; nothing to replay"
                )
    assert after is not None
    live = _live_cursor(store, projection)
    if after >= live:
        raise InvalidInputError(
            f"cursor {after} is not behind the projection's cursor {live}; nothing to replay"
        )
    run_id = _start_run(
        store,
        projection,
        "replay",
        trigger="operator",
        actor=actor or default_actor(),
        start=after,
        target=live,
    )
    with store.pool.connection() as conn, conn.transaction():
        current, version = state.lock_cursor(conn, projection.name)
        state.set_cursor(conn, projection.name, after, version)
    log.info(
        "projection_replay_requested",
        projection=projection.name,
        run_id=run_id,
        after=str(after),
        until=str(current),
    )
    return run_id


def _fail_run(store: EventStore, run_id: int, exc: BaseException, schema: str) -> None:
    try:
        with store.pool.connection() as conn:
            tables.drop_schema(conn, schema)
            status: state.RunStatus = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
            state.finish_run(conn, run_id, status, error=f"{type(exc).__name__}: {exc}"[:4000])
    except psycopg.Error:
        log.exception("projection_run_not_closed", run_id=run_id)

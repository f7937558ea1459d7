"""Rebuild, verify and replay: the operator's levers on a projection, each recorded as a run.

- rebuild: build the projection from the start of the log into a shadow schema, catch up with the live
  cursor, then swap the shadow tables in atomically, with the cursor, in one transaction.
- verify: build a scratch copy up to the live cursor and compare digests at the same cursor, naming the
  rows that differ.
- replay: for a projection that declares `replay_in_place`, move the cursor back; the worker holding the
  lease re-applies from there and completes the run. Any other projection is rebuilt instead, which
  gives the state a correct replay would give.

With a tenant, a per-tenant projection's rows of that tenant alone are rebuilt (or verified): the scratch
copy holds only that tenant's rows, and they replace the live ones behind a fence on that tenant
(`projector.tenant_rebuild`; of a partitioned projection, one fence per segment, at its cursor).

Each lever first records its run (`start_rebuild`, `start_verify`, `start_replay`): one rebuild, replay
or verify per projection and scope at a time, a second request gets `RunInProgressError` naming the
first. `PendingRun.execute()` then does the work, in the caller's thread or a background one. The final
step of rebuild and verify locks the projection's cursor row, so the live worker pauses for that moment
only and both copies stand at the same cursor.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog
import tenacity

from eventstore import ConflictError, Cursor, EventStore, InvalidInputError, LedgerflowError, NotFoundError
from projector import bookkeeping, fences, tables
from projector.digest import TableDifference, differing_rows, projection_digest
from projector.errors import RunInProgressError, TablesBusyError, wrap_exceptions
from projector.projection import Projection
from projector.segments import check_partitions, ensure_cursors, projection_cursor, units_of
from projector.shadow import Progress, ShadowBuild
from projector.tenant_rebuild import replace_tenant_rows

log = structlog.get_logger(__name__)
#: Tries at recording an operator run when the one that held its scope ends meanwhile.
_START_ATTEMPTS = 3

_SWAP_LOCK_TIMEOUT_MS = 100  # well below PostgreSQL's default deadlock_timeout of 1 s
_SWAP_ATTEMPTS = 100
#: A run whose owner has not heartbeaten for this long is marked abandoned before a new one starts.
ABANDONED_AFTER = 30.0
#: How often a rebuild, replay or verify renews its run's heartbeat (well within ABANDONED_AFTER).
HEARTBEAT_INTERVAL = 5.0

__all__ = [
    "PendingRun",
    "Progress",
    "RebuildResult",
    "ReplayResult",
    "VerifyResult",
    "rebuild",
    "replay",
    "start_rebuild",
    "start_replay",
    "start_verify",
    "sweep_abandoned",
    "verify",
]


def default_actor() -> str:
    return f"{os.environ.get('USER', 'unknown')}@{socket.gethostname()}"


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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


@dataclass(frozen=True)
class ReplayResult:
    """An in-place replay was handed to the live worker, which completes the run when it is back."""

    run_id: int
    after: Cursor
    until: Cursor


OperatorResult = RebuildResult | VerifyResult | ReplayResult


class PendingRun:
    """A recorded rebuild, replay or verify, not yet carried out. `kind` is what runs: a replay that
    cannot happen in place runs as a rebuild, and `note` says so.

    From `start_heartbeats()` (called by `execute()` if not before) until the work ends, a thread renews
    the run's heartbeat, so neither a run waiting for a job thread nor one inside a long transaction is
    taken for abandoned."""

    def __init__(
        self,
        store: EventStore,
        run_id: int,
        kind: bookkeeping.RunKind,
        projection: Projection,
        tenant: str | None,
        note: str | None,
        work: Callable[[Progress | None], OperatorResult],
    ) -> None:
        self.store, self.run_id, self.kind = store, run_id, kind
        self.projection, self.tenant, self.note = projection, tenant, note
        self._work = work
        self._done = threading.Event()
        self._beating: threading.Thread | None = None

    def start_heartbeats(self) -> None:
        if self._beating is None:
            self._beating = threading.Thread(
                target=self._beat, name=f"run-{self.run_id}-heartbeat", daemon=True
            )
            self._beating.start()

    def execute(self, progress: Progress | None = None) -> OperatorResult:
        self.start_heartbeats()
        try:
            return self._work(progress)
        finally:
            self._done.set()

    def _beat(self) -> None:
        while not self._done.wait(HEARTBEAT_INTERVAL):
            try:
                with wrap_exceptions(), self.store.pool.connection() as conn:
                    bookkeeping.heartbeat_run(conn, self.run_id)
            except LedgerflowError as exc:
                # The run's own work meets the same outage and fails the run, or outlives it.
                log.debug("projection_run_heartbeat_missed", run_id=self.run_id, error=str(exc))


# -- starting runs ----------------------------------------------------------------------------------


def sweep_abandoned(
    conn: psycopg.Connection[Any], timeout: float = ABANDONED_AFTER
) -> list[tuple[int, str, str, str]]:
    """Mark runs whose owner stopped heartbeating as abandoned, and drop every scratch schema whose run
    is no longer running (its owner crashed before it could). Returns the runs marked."""
    marked = bookkeeping.mark_abandoned_runs(conn, timeout)
    running = bookkeeping.running_run_ids(conn)
    for schema in bookkeeping.scratch_schemas(conn):
        if tables.run_of_scratch_schema(schema) not in running:
            tables.drop_schema(conn, schema)
            log.info("projection_scratch_schema_dropped", schema=schema)
    return marked


def _check_scope(projection: Projection, tenant: str | None) -> None:
    if tenant is not None and not projection.per_tenant:
        raise InvalidInputError(
            f"projection {projection.name!r} is shared by every tenant, so it cannot be rebuilt, replayed "
            "or verified for one tenant; a server administrator can act on all of it"
        )


def _record_run(
    store: EventStore,
    projection: Projection,
    kind: bookkeeping.RunKind,
    *,
    trigger: str,
    actor: str | None,
    tenant: str | None,
    start: Cursor,
    target: Cursor | None,
) -> int:
    """Insert the run row; the partial unique index admits one operator run per projection and scope."""
    with wrap_exceptions(), store.pool.connection() as conn:
        with conn.transaction():
            # A projection no worker has run yet still has tables to verify or replace.
            ensure_cursors(conn, projection)
            tables.ensure_live_tables(conn, projection)
        sweep_abandoned(conn)
        for attempt in range(_START_ATTEMPTS):
            try:
                with wrap_exceptions():
                    run_id = bookkeeping.start_run(
                        conn,
                        projection.name,
                        kind,
                        trigger=trigger,
                        actor=actor or default_actor(),
                        owner=_owner(),
                        start=start,
                        target=target,
                        tenant=tenant,
                    )
                break
            except RunInProgressError as busy:
                running = bookkeeping.running_operator_run(conn, projection.name, tenant)
                # The run that held the scope may have ended between the refused insert and this look:
                # the scope is free, so try again rather than answer a conflict that names no run.
                if running is None and attempt + 1 < _START_ATTEMPTS:
                    continue
                raise RunInProgressError(projection.name, *(running or (None, None))) from busy.__cause__
        # Counted once, for the progress shown (a total, a rate, the time left). A rebuild or verify goes
        # to the end of the log, not to the live cursor; events appended meanwhile take it a little past.
        until = target if kind == "replay" else None
        bookkeeping.count_run_events(
            conn, run_id, start=start, target=until, tenant=tenant, types=projection.event_types
        )
        return run_id


def _live_cursor(store: EventStore, projection: Projection, *, highest: bool = False) -> Cursor:
    """The projection's cursor (of a partitioned one: its lowest segment's, or with `highest` its
    highest's: how far any of its rows got)."""
    with wrap_exceptions(), store.pool.connection() as conn:
        if highest and projection.partitions > 1:
            segments = bookkeeping.segment_cursors(conn, projection.name)
            if segments:
                return max(segments.values())
        return projection_cursor(conn, projection) or Cursor()


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
    _check_scope(projection, tenant)
    run_id = _record_run(
        store,
        projection,
        "rebuild",
        trigger=trigger,
        actor=actor,
        tenant=tenant,
        start=Cursor(),
        target=_live_cursor(store, projection),
    )

    def work(progress: Progress | None) -> OperatorResult:
        return _guarded(
            store, run_id, lambda: _rebuild(store, projection, run_id, tenant, batch_size, progress)
        )

    return PendingRun(store, run_id, "rebuild", projection, tenant, note, work)


def start_verify(
    store: EventStore,
    projection: Projection,
    *,
    actor: str | None = None,
    tenant: str | None = None,
    batch_size: int = 1000,
) -> PendingRun:
    """Record a verify run; execute() builds a scratch copy and compares digests at the live cursor."""
    _check_scope(projection, tenant)
    run_id = _record_run(
        store,
        projection,
        "verify",
        trigger="operator",
        actor=actor,
        tenant=tenant,
        start=Cursor(),
        target=_live_cursor(store, projection),
    )

    def work(progress: Progress | None) -> OperatorResult:
        return _guarded(
            store, run_id, lambda: _verify(store, projection, run_id, tenant, batch_size, progress)
        )

    return PendingRun(store, run_id, "verify", projection, tenant, None, work)


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
    _check_scope(projection, tenant)
    if tenant is not None:
        # One tenant's rows are always rebuilt whole. (Nothing is looked up in the log first: where other
        # tenants' events lie is not this caller's to learn.)
        note = f"the rows of tenant {tenant!r} are rebuilt from the start of the log, as a replay leaves them"
        return start_rebuild(
            store, projection, actor=actor, trigger="replay", tenant=tenant, batch_size=batch_size, note=note
        )
    if since is not None:
        with wrap_exceptions(), store.pool.connection() as conn:
            after = bookkeeping.first_cursor_since(conn, since)
        if after is None:
            raise NotFoundError(f"no event was recorded at or after {since.isoformat()}; nothing to replay")
    assert after is not None
    live = _live_cursor(store, projection, highest=True)
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
    run_id = _record_run(
        store,
        projection,
        "replay",
        trigger="operator",
        actor=actor,
        tenant=None,
        start=after,
        target=live,
    )

    def work(progress: Progress | None) -> OperatorResult:
        return _guarded(store, run_id, lambda: _replay_in_place(store, projection, run_id, after))

    return PendingRun(store, run_id, "replay", projection, None, None, work)


# -- the work ---------------------------------------------------------------------------------------


def _guarded(store: EventStore, run_id: int, work: Callable[[], OperatorResult]) -> OperatorResult:
    """Run `work`; on any failure close the run as failed (or stopped) and drop its scratch schema."""
    try:
        with wrap_exceptions():
            return work()
    except BaseException as exc:
        _fail_run(store, run_id, exc)
        raise


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
    build.run_until(None if tenant is None else _live_cursor(store, projection), progress)
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
        live_cursor, _ = bookkeeping.lock_cursor(conn, projection.name)
        segments = bookkeeping.lock_segment_cursors(conn, projection.name)
        live_cursor = max([live_cursor, *segments.values()])
        fences.lock_fences(conn, projection.name)
        tables.lock_live_tables(conn, projection, _SWAP_LOCK_TIMEOUT_MS)
        build.run_until(None, progress, conn)
        final = max(build.cursor, live_cursor)
        tables.swap_in_shadow(conn, projection, build.schema)
        bookkeeping.set_cursor(conn, projection.name, final, projection.version)
        # The tables now hold every segment's streams up to `final`, under the code's number of partitions.
        bookkeeping.set_partitions(conn, projection.name, projection.partitions)
        if segments or projection.partitions > 1:
            wanted = projection.partitions if projection.partitions > 1 else 0
            bookkeeping.reset_segments(conn, projection.name, wanted, final, projection.version)
        # A tenant being rebuilt meanwhile now has its rows at `final` too (its replacement builds on to it).
        fences.reset_fences(conn, projection.name, [u.key for u in units_of(projection)], final)
        digest = projection_digest(conn, projection, projection.schema)
        bookkeeping.run_progress(conn, run_id, final, 0)
        bookkeeping.finish_run(conn, run_id, "completed", digest=digest)
    return final, digest


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
    build.run_until(_live_cursor(store, projection), progress)
    _wait_for_tenant_rebuilds(store, projection, tenant)
    with store.pool.connection() as conn, conn.transaction():
        # The live cursor only moves forward under this lock (a replay or swap takes it too), and the
        # build never passes the target it is given, so both copies now stand at `live_cursor`.
        live_cursor, _ = bookkeeping.lock_cursor(conn, projection.name)
        floor = live_cursor
        if projection.partitions > 1:
            stored = bookkeeping.get_cursor(conn, projection.name)
            assert stored is not None
            check_partitions(projection, stored)
            # Each segment stands at its own cursor: the copy takes each stream's events up to its
            # segment's, so both copies hold the same events.
            segments = bookkeeping.lock_segment_cursors(conn, projection.name)
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
        bookkeeping.finish_run(
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


def _replay_in_place(store: EventStore, projection: Projection, run_id: int, after: Cursor) -> ReplayResult:
    with store.pool.connection() as conn, conn.transaction():
        current, version = bookkeeping.lock_cursor(conn, projection.name)
        bookkeeping.set_cursor(conn, projection.name, after, version)
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


def _fail_run(store: EventStore, run_id: int, exc: BaseException) -> None:
    try:
        with wrap_exceptions(), store.pool.connection() as conn:
            for schema in bookkeeping.scratch_schemas(conn):
                if tables.run_of_scratch_schema(schema) == run_id:
                    tables.drop_schema(conn, schema)
            status: bookkeeping.RunStatus = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
            bookkeeping.finish_run(conn, run_id, status, error=f"{type(exc).__name__}: {exc}"[:4000])
    except LedgerflowError as failed:
        # Left running, the run is marked abandoned once its heartbeat is old; its schema goes with it.
        log.warning("projection_run_not_closed", run_id=run_id, error=str(failed))


# -- one call each, for scripts and the CLI -------------------------------------------------------------


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

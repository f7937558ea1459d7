"""An operator's lever on a projection (rebuild, verify or replay) as a recorded run: its row, its
heartbeats while it works, its result, and its close when the work fails.

Each lever first records its run (`start_rebuild`, `start_verify`, `start_replay`): one rebuild, replay
or verify per projection and scope at a time, a second request gets `RunInProgressError` naming the
first. `PendingRun.execute()` then does the work, in the caller's thread or a background one. Apart from
the levers themselves (`projector.rebuild`, `projector.verify`, `projector.replay`), which share it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from eventstore import Cursor, EventStore, InvalidInputError, LedgerflowError
from projector import cursor_rows, run_rows, tables
from projector.digest import TableDifference
from projector.errors import RunInProgressError, wrap_exceptions
from projector.projection import Projection
from projector.segments import ensure_cursors, projection_cursor
from projector.shadow import Progress

log = structlog.get_logger(__name__)

#: Tries at recording an operator run when the one that held its scope ends meanwhile.
_START_ATTEMPTS = 3

#: A run whose owner has not heartbeaten for this long is marked abandoned before a new one starts.
ABANDONED_AFTER = 30.0

#: How often a rebuild, replay or verify renews its run's heartbeat (well within ABANDONED_AFTER).
HEARTBEAT_INTERVAL = 5.0


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
        kind: run_rows.RunKind,
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
                    run_rows.heartbeat_run(conn, self.run_id)
            except LedgerflowError as exc:
                # The run's own work meets the same outage and fails the run, or outlives it.
                log.debug("projection_run_heartbeat_missed", run_id=self.run_id, error=str(exc))


def sweep_abandoned(
    conn: psycopg.Connection[Any], timeout: float = ABANDONED_AFTER
) -> list[tuple[int, str, str, str]]:
    """Mark runs whose owner stopped heartbeating as abandoned, and drop every scratch schema whose run
    is no longer running (its owner crashed before it could). Returns the runs marked."""
    marked = run_rows.mark_abandoned_runs(conn, timeout)
    running = run_rows.running_run_ids(conn)
    for schema in run_rows.scratch_schemas(conn):
        if tables.run_of_scratch_schema(schema) not in running:
            tables.drop_schema(conn, schema)
            log.info("projection_scratch_schema_dropped", schema=schema)
    return marked


def check_scope(projection: Projection, tenant: str | None) -> None:
    if tenant is not None and not projection.per_tenant:
        raise InvalidInputError(
            f"projection {projection.name!r} is shared by every tenant, so it cannot be rebuilt, replayed "
            "or verified for one tenant; a server administrator can act on all of it"
        )


def _record_run(
    store: EventStore,
    projection: Projection,
    kind: run_rows.RunKind,
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
                    run_id = run_rows.start_run(
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
                running = run_rows.running_operator_run(conn, projection.name, tenant)
                # The run that held the scope may have ended between the refused insert and this look:
                # the scope is free, so try again rather than answer a conflict that names no run.
                if running is None and attempt + 1 < _START_ATTEMPTS:
                    continue
                raise RunInProgressError(projection.name, *(running or (None, None))) from busy.__cause__
        # Counted once, for the progress shown (a total, a rate, the time left). A rebuild or verify goes
        # to the end of the log, not to the live cursor; events appended meanwhile take it a little past.
        until = target if kind == "replay" else None
        run_rows.count_run_events(
            conn, run_id, start=start, target=until, tenant=tenant, types=projection.event_types
        )
        return run_id


def live_cursor_of(store: EventStore, projection: Projection, *, highest: bool = False) -> Cursor:
    """The projection's cursor (of a partitioned one: its lowest segment's, or with `highest` its
    highest's: how far any of its rows got)."""
    with wrap_exceptions(), store.pool.connection() as conn:
        if highest and projection.partitions > 1:
            segments = cursor_rows.segment_cursors(conn, projection.name)
            if segments:
                return max(segments.values())
        return projection_cursor(conn, projection) or Cursor()


def pending_run(
    store: EventStore,
    projection: Projection,
    kind: run_rows.RunKind,
    *,
    trigger: str,
    actor: str | None,
    tenant: str | None,
    start: Cursor,
    target: Cursor,
    work: Callable[[int, Progress | None], OperatorResult],
    note: str | None = None,
) -> PendingRun:
    """Record an operator run of `kind` and return it pending: executed, it does `work(run_id, progress)`,
    and a failure closes the run (failed, or stopped) and drops its scratch schema."""
    run_id = _record_run(
        store, projection, kind, trigger=trigger, actor=actor, tenant=tenant, start=start, target=target
    )

    def guarded_work(progress: Progress | None) -> OperatorResult:
        return _guarded(store, run_id, lambda: work(run_id, progress))

    return PendingRun(store, run_id, kind, projection, tenant, note, guarded_work)


def _guarded(store: EventStore, run_id: int, work: Callable[[], OperatorResult]) -> OperatorResult:
    """Run `work`; on any failure close the run as failed (or stopped) and drop its scratch schema."""
    try:
        with wrap_exceptions():
            return work()
    except BaseException as exc:
        _fail_run(store, run_id, exc)
        raise


def _fail_run(store: EventStore, run_id: int, exc: BaseException) -> None:
    try:
        with wrap_exceptions(), store.pool.connection() as conn:
            for schema in run_rows.scratch_schemas(conn):
                if tables.run_of_scratch_schema(schema) == run_id:
                    tables.drop_schema(conn, schema)
            status: run_rows.RunStatus = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
            run_rows.finish_run(conn, run_id, status, error=f"{type(exc).__name__}: {exc}"[:4000])
    except LedgerflowError as failed:
        # Left running, the run is marked abandoned once its heartbeat is old; its schema goes with it.
        log.warning("projection_run_not_closed", run_id=run_id, error=str(failed))

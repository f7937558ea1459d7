"""Applying a projection's batches to its live tables: exactly once, under a lease, failures kept.

Each batch commits in one transaction that (1) checks the lease (fencing by epoch), (2) moves the cursor
with a compare-and-set from where the batch started, (3) runs the handlers. A crash at any instant
rolls all three back together; a second applier of the same batch fails the compare-and-set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from opentelemetry import metrics, trace

from eventstore import Cursor, EventStore, RecordedEvent
from eventstore.spi import span_if_traced, wrap_exceptions
from projector import cursor_rows, failure_rows, fences, lease_rows, run_rows
from projector.projection import ApplyContext, Projection
from projector.retries import HandlerFailed, RetrySettings, with_retries
from projector.segments import Unit

log = structlog.get_logger(__name__)
#: How often an idle segment writes how far it has read (see `_step`).
_IDLE_WRITE_INTERVAL = 1.0
_tracer = trace.get_tracer("ledgerflow.projector")
_events_projected = metrics.get_meter("ledgerflow.projector").create_counter(
    "ledgerflow.events.projected", description="Events applied to projections"
)


class LeaseLost(BaseException):
    """This worker no longer holds the projection's lease; it must stop applying at once.

    A BaseException so that handler code catching Exception cannot swallow it."""


class _CursorMoved(Exception):
    """The cursor is not where this runner left it (a replay or a rebuild moved it)."""


@dataclass(frozen=True)
class StepResult:
    applied: int
    caught_up: bool
    blocked: bool = False


class LiveRunner:
    """Moves one projection's live tables forward, batch by batch, while holding its lease; or, with
    `segment`, the rows of that segment's streams, holding that segment's lease (`projector.segments`)."""

    def __init__(
        self,
        store: EventStore,
        projection: Projection,
        *,
        owner: str,
        epoch: int,
        lease_ttl: float = 10.0,
        batch_size: int = 500,
        retry: RetrySettings | None = None,
        catch_up_run: tuple[int, Cursor] | None = None,
        segment: int | None = None,
    ) -> None:
        self.store = store
        self.projection = projection
        #: One segment of a partitioned projection (None: all of it); its rows are recorded under `key`.
        self.unit = Unit(projection, segment)
        self.key = self.unit.key
        self.owner = owner
        self.epoch = epoch
        self.lease_ttl = lease_ttl
        self.batch_size = batch_size
        self.retry = retry or RetrySettings()
        # (run id, target): the catch-up run ends once the runner has read past the target.
        self._catch_up_run: int | None = catch_up_run[0] if catch_up_run else None
        self._catch_up_target: Cursor | None = catch_up_run[1] if catch_up_run else None
        self._replay: tuple[int, Cursor | None] | None = None
        self._failures: list[failure_rows.Failure] | None = None
        self._next_idle_write = 0.0
        self._reload()

    def _open_failures(self) -> list[failure_rows.Failure]:
        """The projection's open failures. Only the lease holder records failures, so while there are none
        there is nothing to re-read; while there are some, every step re-reads them to notice an
        operator's retry or skip."""
        if self._failures is None or self._failures:
            with self.store.pool.connection() as conn:
                self._failures = failure_rows.open_failures(conn, self.key)
        return self._failures

    def _reload(self) -> None:
        with self.store.pool.connection() as conn:
            current = cursor_rows.get_cursor(conn, self.key)
            assert current is not None, "the worker creates the cursor before running"
            self._db_cursor = current.cursor
            self._skipped = failure_rows.skipped_positions(conn, self.key)
            self._replay = run_rows.active_run(conn, self.key, "replay")
        self._read_cursor = self._db_cursor

    @property
    def cursor(self) -> Cursor:
        return self._db_cursor

    @property
    def read_cursor(self) -> Cursor:
        """How far this runner has read (and applied, or found nothing to apply)."""
        return self._read_cursor

    def step(self) -> StepResult:
        """Apply at most one batch. Raises LeaseLost when the lease is gone, DatabaseUnavailableError
        (or another LedgerflowError: driver errors are translated here, once) when the database fails."""
        with wrap_exceptions():
            return self._step()

    def _step(self) -> StepResult:
        name = self.key
        failures = self._open_failures()
        for failure in failures:
            if failure.policy == "park" and failure.status in ("retry_requested", "skip_requested"):
                self._resolve_parked(failure)
                return StepResult(applied=1, caught_up=False)
            if failure.policy == "block" and failure.status == "skip_requested":
                with self.store.pool.connection() as conn:
                    failure_rows.close_failure(conn, failure.id, "skipped")
                self._skipped.add(failure.event_position)
                self._failures = None
                log.info("projection_failure_skipped", projection=name, failure_id=failure.id)
        if any(f.policy == "block" and f.status == "open" for f in failures):
            return StepResult(applied=0, caught_up=False, blocked=True)
        retrying = {f.event_position: f.id for f in failures if f.status == "retry_requested"}
        parked = {(f.tenant, f.stream_id): f.stream_version for f in failures if f.policy == "park"}

        # Read as stored and upcast in `_commit`: an event no upcaster can bring to its latest shape then
        # fails like a handler does, and is retried, then kept as a failure to retry or skip.
        page = self.store.read_all(
            self._read_cursor,
            limit=self.batch_size,
            types=self.projection.event_types,
            upcast=False,
            segment=self.unit.read_segment,
        )
        if not page.events:
            if self._cursor_moved_while_idle():
                self._moved()
                return StepResult(applied=0, caught_up=False)
            # Nothing to apply up to the horizon: read from there next time. The jump is not written to
            # the cursor row; that would be a write per idle poll. A segment writes it at most once a
            # second: its cursor says how far the projection got, and a segment whose streams are quiet
            # would otherwise hold the projection's (lowest) cursor back for ever.
            segment_idle = self.unit.segment is not None and page.cursor > self._db_cursor
            if segment_idle and time.monotonic() >= self._next_idle_write:
                self._next_idle_write = time.monotonic() + _IDLE_WRITE_INTERVAL
                try:
                    self._commit([], page.cursor, {})
                except _CursorMoved:
                    self._moved()
                    return StepResult(applied=0, caught_up=False)
            self._read_cursor = page.cursor
            self._finish_catch_up_if(page.caught_up)
            self._check_replay_done()  # a replay over a range with nothing left to re-apply is done
            return StepResult(applied=0, caught_up=page.caught_up)

        def wanted(e: RecordedEvent) -> bool:
            parked_at = parked.get((e.tenant, e.stream_id))
            return e.position not in self._skipped and (parked_at is None or e.stream_version < parked_at)

        to_apply = [e for e in page.events if wanted(e)]
        try:
            with_retries(self.retry, lambda: self._commit(to_apply, page.cursor, retrying))
        except _CursorMoved:
            self._moved()
            return StepResult(applied=0, caught_up=False)
        except HandlerFailed as failed:
            return self._one_by_one(page.events, wanted, retrying, failed)
        self._finish_catch_up_if(page.caught_up)
        return StepResult(applied=len(to_apply), caught_up=page.caught_up)

    def _cursor_moved_while_idle(self) -> bool:
        """Whether the cursor row is no longer where this runner left it. A busy runner learns it from its
        next compare-and-set; an idle one looks (one primary-key read per empty page), so a replay starts
        at once rather than at the next append."""
        with self.store.pool.connection() as conn:
            current = cursor_rows.get_cursor(conn, self.key)
        return current is not None and current.cursor != self._db_cursor

    # -- committing -----------------------------------------------------------------------------------

    def _commit(
        self,
        events: Sequence[RecordedEvent],
        new_cursor: Cursor,
        retrying: dict[int, int],
        extra: Callable[[psycopg.Connection[Any]], None] | None = None,
    ) -> None:
        name = self.key
        span = span_if_traced(
            _tracer,
            "ledgerflow.projection.batch",
            lambda: {"ledgerflow.projection": name, "ledgerflow.events": len(events)},
        )
        with span, self.store.pool.connection() as conn, conn.transaction():
            if not lease_rows.hold_lease(conn, name, self.owner, self.epoch, self.lease_ttl):
                raise LeaseLost(f"lease of {name!r} (epoch {self.epoch}) is no longer held by {self.owner}")
            if not cursor_rows.advance_cursor(conn, name, self._db_cursor, new_cursor, len(events)):
                raise _CursorMoved
            events = self._unfenced(conn, events)
            try:
                upcast = self.store.types.upcast
                self.projection.apply(
                    ApplyContext(conn, self.projection.schema, self.projection.table_names),
                    [upcast(e) for e in events],
                )
            except psycopg.OperationalError:
                raise  # the connection failed, not the handler: `step` reports the database unavailable
            except Exception as exc:
                raise HandlerFailed(exc, events[0] if len(events) == 1 else None) from exc
            for e in events:
                if e.position in retrying:
                    failure_rows.close_failure(conn, retrying.pop(e.position), "resolved")
                    self._failures = None
            for run_id in self._runs_to_advance():
                run_rows.run_progress(conn, run_id, new_cursor, len(events))
            if extra is not None:
                extra(conn)
        self._db_cursor = self._read_cursor = new_cursor
        _events_projected.add(len(events), {"projection": self.projection.name})
        self._check_replay_done()

    def _unfenced(
        self, conn: psycopg.Connection[Any], events: Sequence[RecordedEvent]
    ) -> Sequence[RecordedEvent]:
        """The batch's events less those of tenants whose rows a rebuild is replacing (migration 0036).
        Read after the compare-and-set, under the cursor row lock, so a fence is either seen here or was
        set after this batch commits. A fence whose run has ended is lifted here, in this batch. A segment
        reads and lifts its own fences only (one per segment, `projector.tenant_rebuild`): its streams'
        events after the fence's cursor up to its own, which no other segment applies."""
        if not self.projection.per_tenant:
            return events  # only a per-tenant projection's rows are rebuilt tenant by tenant
        held: set[str] = set()
        for fenced in fences.fences_of(conn, self.key):
            if fenced.run_running:
                held.add(fenced.tenant)
                continue
            applied = fences.lift(
                conn, self.store, self.projection, self.unit, fenced, self._db_cursor, self._wanted
            )
            log.warning(
                "projection_tenant_fence_lifted",
                projection=self.key,
                tenant=fenced.tenant,
                run_id=fenced.run_id,
                applied=applied,
            )
        return [e for e in events if e.tenant not in held] if held else events

    def _wanted(self, e: RecordedEvent) -> bool:
        """The live projection's decisions about failures: skipped events and parked streams stay so."""
        failures = self._failures or ()
        parked = {(f.tenant, f.stream_id): f.stream_version for f in failures if f.policy == "park"}
        parked_at = parked.get((e.tenant, e.stream_id))
        return e.position not in self._skipped and (parked_at is None or e.stream_version < parked_at)

    def _one_by_one(
        self,
        events: Sequence[RecordedEvent],
        wanted: Callable[[RecordedEvent], bool],
        retrying: dict[int, int],
        failed: HandlerFailed,
    ) -> StepResult:
        """A batch failed: apply its events one at a time to find, and keep, the one that fails."""
        applied = 0
        for e in events:
            batch = [e] if wanted(e) else []
            try:
                with_retries(self.retry, lambda b=batch, c=e.cursor: self._commit(b, c, retrying))  # type: ignore[misc]
            except _CursorMoved:
                self._moved()
                break
            except HandlerFailed as exc:
                return self._fail(e, exc.error)
            applied += len(batch)
        del failed
        return StepResult(applied=applied, caught_up=False)

    def _fail(self, event: RecordedEvent, error: BaseException) -> StepResult:
        self._failures = None
        name, policy = self.key, self.projection.failure_policy
        attempts = self.retry.attempts
        if policy == "block":
            with self.store.pool.connection() as conn:
                failure_id = failure_rows.record_failure(conn, name, event, policy, error, attempts)
            log.error(
                "projection_blocked",
                projection=name,
                failure_id=failure_id,
                position=event.position,
                error=str(error),
            )
            return StepResult(applied=0, caught_up=False, blocked=True)
        # Park: record the failure and move the cursor past the event in one transaction; the stream's
        # later events wait for the operator, other streams go on.
        self._commit([], event.cursor, {}, extra=lambda conn: self._record(conn, event, error, attempts))
        log.error(
            "projection_stream_parked",
            projection=name,
            stream_id=event.stream_id,
            position=event.position,
            error=str(error),
        )
        return StepResult(applied=0, caught_up=False)

    def _record(
        self, conn: psycopg.Connection[Any], event: RecordedEvent, error: BaseException, n: int
    ) -> None:
        failure_rows.record_failure(conn, self.key, event, self.projection.failure_policy, error, n)

    def _resolve_parked(self, failure: failure_rows.Failure) -> None:
        """Carry out an operator's retry or skip of a parked stream: apply the failed event (unless
        skipped) and the stream's later events that were parked behind it, in one transaction."""
        self._failures = None
        skip = failure.status == "skip_requested"
        from_version = failure.stream_version + (1 if skip else 0)
        with self.store.pool.connection() as conn:
            events = failure_rows.failure_events(conn, failure, from_version, self._db_cursor)

        def close(conn: psycopg.Connection[Any]) -> None:
            failure_rows.close_failure(conn, failure.id, "skipped" if skip else "resolved")

        try:
            with_retries(self.retry, lambda: self._commit(events, self._db_cursor, {}, extra=close))
        except _CursorMoved:
            self._moved()
            return
        except HandlerFailed as exc:
            first = events[0] if events else None
            if first is not None:
                with self.store.pool.connection() as conn:
                    failure_rows.record_failure(conn, self.key, first, "park", exc.error, self.retry.attempts)
            return
        if skip:
            self._skipped.add(failure.event_position)
        log.info(
            "projection_stream_unparked",
            projection=self.key,
            stream_id=failure.stream_id,
            applied=len(events),
            skipped=skip,
        )

    # -- runs -----------------------------------------------------------------------------------------

    def _runs_to_advance(self) -> list[int]:
        runs = [self._catch_up_run] if self._catch_up_run is not None else []
        if self._replay is not None:
            runs.append(self._replay[0])
        return runs

    def _finish_catch_up_if(self, caught_up: bool) -> None:
        target = self._catch_up_target
        if (
            caught_up
            and self._catch_up_run is not None
            and target is not None
            and self._read_cursor >= target
        ):
            with self.store.pool.connection() as conn:
                run_rows.finish_run(conn, self._catch_up_run, "completed")
            log.info("projection_caught_up", projection=self.key, run_id=self._catch_up_run)
            self._catch_up_run = None

    def _check_replay_done(self) -> None:
        if self._replay is None:
            return
        run_id, target = self._replay
        if target is None or max(self._db_cursor, self._read_cursor) >= target:
            with self.store.pool.connection() as conn:
                run_rows.finish_run(conn, run_id, "completed")
            log.info("projection_replay_completed", projection=self.key, run_id=run_id)
            self._replay = None

    def _moved(self) -> None:
        log.info("projection_cursor_moved", projection=self.key)
        self._reload()

    def close(self, status: run_rows.RunStatus = "stopped") -> None:
        """End this runner's open catch-up run (on release or shutdown)."""
        if self._catch_up_run is not None:
            with self.store.pool.connection() as conn:
                run_rows.finish_run(conn, self._catch_up_run, status)
            self._catch_up_run = None

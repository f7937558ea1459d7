"""Projector workers: any number, in any number of processes, share projections through leases.

A worker takes every projection whose lease is free or lapsed, applies batches with `LiveRunner`, and
renews its leases from its keepalive (`eventstore.keepalive`), from the moment a lease is taken: also
while a version change rebuilds the projection before its runner starts. A worker that loses a lease
(paused, partitioned) stops applying that projection: the fencing check in every batch refuses its
commits anyway. On stop it releases its leases at once so another worker takes over without waiting for
expiry. Every worker also marks runs whose owner stopped heartbeating as abandoned.

A worker never ends because of the database: an outage (terminated connections, a restart, no free
connection slot) is logged once, waited out with back-off, and work resumes where it stood. One
projection's failure never stops the others: it is logged and that projection is tried again later.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog

from eventstore import ConflictError, Cursor, EventStore
from eventstore.spi import (
    Beat,
    Keepalive,
    Outage,
    OutageState,
    bounded_once_stopping,
    end_frozen_sessions,
    is_unavailable,
    wait_until_available,
)
from projector import cursor_rows, lease_rows, run_rows, tables
from projector.projection import Projection
from projector.rebuild import rebuild
from projector.runner import LeaseLost, LiveRunner, RetrySettings
from projector.segments import PartitionsChangedError, Unit, check_partitions, ensure_cursors, units_of

log = structlog.get_logger(__name__)
_HORIZON_RECHECK_MIN = 0.005
_HORIZON_RECHECK_MAX = 0.05
#: A projection whose step failed (not for lack of a database) is tried again after this long...
_FAILED_RETRY_MIN = 0.5
#: ...doubling up to this.
_FAILED_RETRY_MAX = 30.0


@dataclass(frozen=True)
class WorkerSettings:
    lease_ttl: float = 10.0
    heartbeat_interval: float = 3.0
    #: A run whose heartbeat is older than this is marked abandoned.
    abandoned_after: float = 30.0
    batch_size: int = 1000
    poll_interval: float = 1.0
    retry: RetrySettings = field(default_factory=RetrySettings)
    #: On stop, how long releasing the leases (and closing their runs) may wait for the database; skipped
    #: after that: the leases lapse by themselves, and a standby takes over.
    shutdown_database_timeout: float = 3.0
    #: How often a worker looks at the spread of partitioned projections' segments over the live workers
    #: (one query of the leases and of the connected workers), and takes or hands over segments.
    balance_interval: float = 0.5


def _cursor_of(conn: psycopg.Connection[Any], name: str) -> Cursor:
    current = cursor_rows.get_cursor(conn, name)
    return current.cursor if current else Cursor()


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ProjectorWorker:
    def __init__(
        self,
        store: EventStore,
        projections: Sequence[Projection],
        settings: WorkerSettings | None = None,
        *,
        worker_id: str | None = None,
        outage: Outage | None = None,
        listener_name: str = "ledgerflow-projector-listener",
    ) -> None:
        self.store = store
        self.projections = {p.name: p for p in projections}
        #: What leases cover, by key: each projection, or each segment of a partitioned one.
        self._units: dict[str, Unit] = {u.key: u for p in projections for u in units_of(p)}
        self._next_balance = 0.0
        self._began = time.monotonic()
        self.settings = settings or WorkerSettings()
        self.id = worker_id or new_worker_id()
        self.stopping = threading.Event()
        #: A projector worker inside another process's worker (a workflow worker's trigger projections)
        #: shares that worker's outage, so the process logs one outage once, and names its listener for it,
        #: so doctor does not count it as a projector worker.
        self.outage = outage or Outage(worker=self.id, role="projector")
        self._listener_name = listener_name
        self._runners: dict[str, LiveRunner] = {}
        #: Every lease this worker holds, by projection: epoch. Renewed from the moment it is taken, also
        #: while the projection is rebuilt before its runner starts.
        self._leases: dict[str, int] = {}
        #: Projections not to take or step before this monotonic time (after a failure), and the delay.
        self._not_before: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Work until `stop()`; then release every lease. From the stop on, no step waits for a pooled
        connection longer than the database's allowance, whether the database answers or not."""
        seconds = self.settings.shutdown_database_timeout
        with bounded_once_stopping(self.store.pool, self.stopping, seconds):
            self._run()

    def _run(self) -> None:
        keepalive = Keepalive(
            self.store.url,
            self._wake,
            self.outage,
            [Beat("projector_heartbeat", self.settings.heartbeat_interval, self.heartbeat)],
            application_name=self._listener_name,
            make_room=self.store.shed_idle_connections,
        )
        keepalive.start()
        log.info("projector_worker_started", worker=self.id, projections=sorted(self.projections))
        horizon_wait = _HORIZON_RECHECK_MIN
        try:
            while not self.stopping.is_set():
                if self.outage.failing() and not self._wait_for_database():
                    break
                if self.work_once():
                    horizon_wait = _HORIZON_RECHECK_MIN
                    continue
                if self._waiting_on_horizon():
                    # Committed events wait behind an older transaction, which may never notify when it
                    # ends: look again soon rather than after a whole poll interval.
                    self._wake.wait(horizon_wait)
                    horizon_wait = min(horizon_wait * 2, _HORIZON_RECHECK_MAX)
                else:
                    self._wake.wait(self.settings.poll_interval)
                self._wake.clear()
        finally:
            self.stopping.set()
            self._wake.set()
            began = time.monotonic()
            keepalive.stop(timeout=self.settings.shutdown_database_timeout)
            self.release_all()
            log.info("projector_worker_stopped", worker=self.id, seconds=round(time.monotonic() - began, 3))

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    @staticmethod
    def dedicated_connections() -> dict[str, int]:
        """The connections a projector worker opens beside its store's pool, by purpose: batches, leases
        and heartbeats share the pool."""
        return {"listener": 1}

    def database_state(self) -> OutageState:
        """Whether this worker is waiting for the database, for health reports."""
        return self.outage.snapshot()

    def _wait_for_database(self) -> bool:
        return wait_until_available(self.store.pool, self.outage, self.stopping)

    def _waiting_on_horizon(self) -> bool:
        try:
            return self.store.events_beyond_horizon()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self.outage.failed(exc)
            return False

    def prepare(self) -> None:
        """Create every projection's cursor and tables now, so readers can query them before the first
        batch (whichever worker ends up holding the lease)."""
        for projection in self.projections.values():
            with self.store.pool.connection() as conn, conn.transaction():
                ensure_cursors(conn, projection)
                tables.ensure_live_tables(conn, projection)

    def work_once(self) -> bool:
        """Take free leases and apply one batch per held projection. True if there may be more work.

        A database outage is reported (the caller waits it out); any other failure is confined to the
        projection it came from, which is tried again after a back-off."""
        try:
            self.acquire_free_leases()
            busy = False
            for name in list(self._runners):
                if self.stopping.is_set():
                    break
                if self._resting(name):
                    continue
                try:
                    busy |= self._step(name)
                except Exception as exc:
                    if is_unavailable(exc):
                        raise
                    self._failed(name, "projection_step_failed")
            return busy
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self.outage.failed(exc)
            return False

    def run_until_caught_up(self, timeout: float = 60.0) -> None:
        """Work until every projection has applied every event committed before this call (or is
        blocked by a failure). For tests and one-shot CLI use."""
        target = self.store.committed_so_far()
        deadline = time.monotonic() + timeout
        next_heartbeat = time.monotonic() + self.settings.heartbeat_interval
        while time.monotonic() < deadline:
            if time.monotonic() >= next_heartbeat:  # no keepalive thread here: renew the leases inline
                self.heartbeat()
                next_heartbeat = time.monotonic() + self.settings.heartbeat_interval
            self.acquire_free_leases()
            results = {name: runner.step() for name, runner in list(self._runners.items())}
            if len(results) == len(self._units) and all(
                r.blocked or (r.caught_up and self._runners[name].read_cursor >= target)
                for name, r in results.items()
            ):
                return
            if not any(r.applied for r in results.values()):
                time.sleep(0.005)  # waiting for the horizon to pass "now": poll, don't spin
        raise TimeoutError(f"projections not caught up within {timeout}s")

    def _step(self, name: str) -> bool:
        runner = self._runners.get(name)
        if runner is None:  # the heartbeat found the lease lost meanwhile
            return False
        try:
            result = runner.step()
        except LeaseLost:
            log.warning("projection_lease_lost", projection=name, worker=self.id)
            self._lost(name)
            return False
        self._not_before.pop(name, None)
        return not result.caught_up and not result.blocked

    def _resting(self, name: str) -> bool:
        rest = self._not_before.get(name)
        return rest is not None and time.monotonic() < rest[0]

    def _failed(self, name: str, event: str) -> None:
        """Log a projection's failure (with its traceback: it is a bug or a broken projection, not an
        outage) and rest that projection, doubling the rest each time it fails again."""
        log.exception(event, projection=name, worker=self.id, retry_in=self._rest(name))

    # -- leases ---------------------------------------------------------------------------------------

    def acquire_free_leases(self) -> None:
        wanted = self._balance_segments()
        for name, unit in self._units.items():
            if name in self._runners or self.stopping.is_set() or self._resting(name):
                continue
            if unit.segment is not None and name not in wanted and name not in self._leases:
                continue  # another worker's share, or not this worker's turn to look
            epoch = self._leases.get(name)  # taken before, but its runner did not start (an outage)
            if epoch is None:
                with self.store.pool.connection() as conn:
                    epoch = lease_rows.acquire_lease(conn, name, self.id, self.settings.lease_ttl)
                if epoch is None:
                    continue
                with self._lock:
                    self._leases[name] = epoch
                log.info("projection_lease_acquired", projection=name, worker=self.id, epoch=epoch)
            try:
                self._take(unit, epoch)
            except PartitionsChangedError as exc:
                log.error("projection_partitions_changed", projection=unit.projection.name, error=str(exc))
                self._release(name, epoch)
                self._rest(name)
            except ConflictError as exc:
                # Someone else rebuilds it (an operator, or a worker that died mid-rebuild whose run
                # is not yet marked abandoned): hand the lease back and look again later.
                log.warning("projection_take_deferred", projection=name, worker=self.id, reason=str(exc))
                self._release(name, epoch)
                self._rest(name)
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                self._failed(name, "projection_take_failed")
                self._release(name, epoch)

    def _rest(self, name: str) -> float:
        """Leave `name` alone for a while, twice as long as last time; returns how long."""
        previous = self._not_before.get(name)
        delay = min(_FAILED_RETRY_MAX, previous[1] * 2) if previous else _FAILED_RETRY_MIN
        self._not_before[name] = (time.monotonic() + delay, delay)
        return delay

    def _balance_segments(self) -> set[str]:
        """The free segments this worker should try to take now; and, when it holds more of a partitioned
        projection's segments than its share, the excess released, for a worker with fewer to take.

        The share is ceil(segments / live projector workers), the workers counted by their listening
        connections (`lease_rows.live_workers`). A segment free for longer than a lease's TTL is taken
        whatever the share, so no segment waits for ever on workers that are not running its projection.
        Looked at every `balance_interval` seconds; in between, nothing is taken."""
        partitioned = [p for p in self.projections.values() if p.partitions > 1]
        now = time.monotonic()
        if not partitioned or now < self._next_balance or self.stopping.is_set():
            return set()
        self._next_balance = now + self.settings.balance_interval
        wanted: set[str] = set()
        with self.store.pool.connection() as conn:
            live = max(1, lease_rows.live_workers(conn, self._listener_name))
            leases = {p.name: lease_rows.segment_leases(conn, p.name) for p in partitioned}
        for p in partitioned:
            share = -(-p.partitions // live)
            mine = sorted(u.segment for u in units_of(p) if u.key in self._leases and u.segment is not None)
            for k in mine[share:]:
                self._hand_over(Unit(p, k))
            room = share - min(len(mine), share)
            for k in range(p.partitions):
                lease = leases[p.name].get(k)
                key = Unit(p, k).key
                if key in self._leases or (lease is not None and lease.alive):
                    continue
                # Free for longer than a lease lasts (or never taken since this worker began): nobody
                # with room wants it, so it is taken beyond the share rather than left unapplied.
                lapsed_for = now - self._began if lease is None else lease.lapsed_for
                if room > 0 or lapsed_for > self.settings.lease_ttl:
                    wanted.add(key)
                    room -= 1
        return wanted

    def _hand_over(self, unit: Unit) -> None:
        """Release a segment beyond this worker's share (its batch in flight has committed: the loop runs
        batches and this in turn)."""
        with self._lock:
            epoch = self._leases.get(unit.key)
        if epoch is None:
            return
        self._drop(unit.key, "stopped")
        self._release(unit.key, epoch)
        log.info("projection_segment_handed_over", projection=unit.key, worker=self.id)

    def _take(self, unit: Unit, epoch: int) -> None:
        projection, name = unit.projection, unit.key
        with self.store.pool.connection() as conn, conn.transaction():
            current = ensure_cursors(conn, projection)
            tables.ensure_live_tables(conn, projection)
        if current.version != projection.version:
            log.info(
                "projection_version_changed",
                projection=projection.name,
                stored=current.version,
                code=projection.version,
            )
            # The keepalive renews the lease (it is in self._leases) for as long as this takes.
            rebuild(
                self.store,
                projection,
                actor=self.id,
                trigger="version_change",
                batch_size=self.settings.batch_size,
            )
            with self.store.pool.connection() as conn:
                current = ensure_cursors(conn, projection)
        # A changed number of partitions is a rebuild, which the operator asks for: until then, refuse.
        check_partitions(projection, current)
        # The catch-up run ends once everything committed before it began has been applied.
        target = self.store.committed_so_far()
        with self.store.pool.connection() as conn:
            run_id = run_rows.start_run(
                conn,
                name,
                "catch_up",
                trigger="lease_acquired",
                actor=self.id,
                owner=self.id,
                start=_cursor_of(conn, name),
                target=target,
            )
        runner = LiveRunner(
            self.store,
            projection,
            owner=self.id,
            epoch=epoch,
            lease_ttl=self.settings.lease_ttl,
            batch_size=self.settings.batch_size,
            retry=self.settings.retry,
            catch_up_run=(run_id, target),
            segment=unit.segment,
        )
        with self._lock:
            if self._leases.get(name) == epoch:  # not lost while the runner was being set up
                self._runners[name] = runner
                return
        runner.close("stopped")

    def _lost(self, name: str) -> None:
        with self._lock:
            self._leases.pop(name, None)
        self._drop(name, "stopped")

    def _drop(self, name: str, status: run_rows.RunStatus) -> None:
        with self._lock:
            runner = self._runners.pop(name, None)
        if runner is not None:
            try:
                runner.close(status)
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                log.warning("projection_run_not_closed", projection=name)

    def _release(self, name: str, epoch: int) -> None:
        with self._lock:
            self._leases.pop(name, None)
        try:
            with self.store.pool.connection() as conn:
                lease_rows.release_lease(conn, name, self.id, epoch)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            log.warning("projection_lease_not_released", projection=name)

    def release_all(self) -> None:
        with self._lock:
            held = dict(self._leases)
        for name, epoch in held.items():
            if self.outage.failing():
                # The database is away: each release would only wait for it. The leases lapse instead.
                log.warning("projection_lease_not_released", projection=name, worker=self.id)
                self._lost(name)
                continue
            self._release(name, epoch)
            self._drop(name, "stopped")
            log.info("projection_lease_released", projection=name, worker=self.id)

    def heartbeat(self) -> None:
        """Renew every lease held (also those of projections being rebuilt) and run heartbeats, and mark
        other owners' dead runs abandoned."""
        with self._lock:
            held = dict(self._leases)
        with self.store.pool.connection() as conn:
            for name, epoch in held.items():
                if not lease_rows.renew_lease(conn, name, self.id, epoch, self.settings.lease_ttl):
                    log.warning("projection_lease_lost", projection=name, worker=self.id)
                    self._lost(name)
            run_rows.heartbeat_runs(conn, self.id)
            end_frozen_sessions(conn, self.settings.lease_ttl)
            for run_id, projection, kind, owner in run_rows.mark_abandoned_runs(
                conn, self.settings.abandoned_after
            ):
                log.warning(
                    "projection_run_abandoned", run_id=run_id, projection=projection, kind=kind, owner=owner
                )

"""A projector worker's state and its leases: taking free leases (and its share of partitioned projections'
segments), starting a runner for each, renewing them from the heartbeat, and releasing them.

The loop that drives this, and what a worker does with its leases, is described in `projector.worker`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import structlog

from eventstore import ConflictError, Cursor, EventStore
from eventstore.spi import Outage, end_frozen_sessions, is_unavailable
from projector import cursor_rows, lease_rows, run_rows, tables
from projector.projection import Projection
from projector.rebuild import rebuild
from projector.runner import LiveRunner
from projector.segments import PartitionsChangedError, Unit, check_partitions, ensure_cursors, units_of
from projector.worker_settings import WorkerSettings

log = structlog.get_logger(__name__)
#: A projection whose step failed (not for lack of a database) is tried again after this long...
_FAILED_RETRY_MIN = 0.5
#: ...doubling up to this.
_FAILED_RETRY_MAX = 30.0


def _cursor_of(conn: psycopg.Connection[Any], name: str) -> Cursor:
    current = cursor_rows.get_cursor(conn, name)
    return current.cursor if current else Cursor()


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseHolder:
    """The state of a projector worker and everything it does with leases; `ProjectorWorker` adds the loop."""

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
        #: When the loop next asks for leases that other workers held at its last look (`look_for_leases`).
        self._next_look = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def _resting(self, name: str) -> bool:
        rest = self._not_before.get(name)
        return rest is not None and time.monotonic() < rest[0]

    def _failed(self, name: str, event: str) -> None:
        """Log a projection's failure (with its traceback: it is a bug or a broken projection, not an
        outage) and rest that projection, doubling the rest each time it fails again."""
        log.exception(event, projection=name, worker=self.id, retry_in=self._rest(name))

    def look_for_leases(self) -> None:
        """The loop's `acquire_free_leases`: while another worker holds a lease this one would take, at most
        once per poll interval. Every append wakes the loop, and asking at every wake cost the database a
        transaction each time for nothing (two workflow workers, each with its trigger projections:
        308 refused takes in a 500-workflow burst). A lease another worker releases or lets lapse is
        taken at the next look, within the poll interval, as it is on an idle log."""
        if time.monotonic() < self._next_look:
            return
        if self.acquire_free_leases():
            self._next_look = time.monotonic() + self.settings.poll_interval

    def acquire_free_leases(self) -> bool:
        """Take every free or lapsed lease this worker would hold, and start their runners; True if one of
        them was held by another worker."""
        held_elsewhere = False
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
                    held_elsewhere = True
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
        return held_elsewhere

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

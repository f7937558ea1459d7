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

import time

import structlog

from eventstore.spi import (
    Beat,
    Keepalive,
    OutageState,
    bounded_once_stopping,
    is_unavailable,
    wait_until_available,
)
from projector import tables
from projector.runner import LeaseLost
from projector.segments import ensure_cursors
from projector.worker_leases import LeaseHolder

log = structlog.get_logger(__name__)
_HORIZON_RECHECK_MIN = 0.005
_HORIZON_RECHECK_MAX = 0.05


class ProjectorWorker(LeaseHolder):
    """The loop: applies a batch of each projection whose lease it holds, until stopped. Its state and its
    leases are `LeaseHolder`'s."""

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
                # Only a worker with projections to step has events to wait for (one that holds none
                # would ask the database at every wake).
                if self._runners and self._waiting_on_horizon():
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
            self.look_for_leases()
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

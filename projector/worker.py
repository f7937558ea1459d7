"""Projector workers: any number, in any number of processes, share projections through leases.

A worker takes every projection whose lease is free or lapsed, applies batches with `LiveRunner`, and
renews its leases from a heartbeat thread. A worker that loses a lease (paused, partitioned) stops
applying that projection: the fencing check in every batch refuses its commits anyway. On stop it
releases its leases at once so another worker takes over without waiting for expiry. Every worker also
marks runs whose owner stopped heartbeating as abandoned.
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

from eventstore import Cursor, DatabaseUnavailableError, EventStore
from eventstore.sqlfile import load_queries
from projector import state, tables
from projector.projection import Projection
from projector.rebuild import rebuild
from projector.runner import LeaseLost, LiveRunner, RetrySettings

log = structlog.get_logger(__name__)
_EVENTSTORE_Q = load_queries("eventstore")
_HORIZON_RECHECK_MIN = 0.005
_HORIZON_RECHECK_MAX = 0.05


@dataclass(frozen=True)
class WorkerSettings:
    lease_ttl: float = 10.0
    heartbeat_interval: float = 3.0
    #: A run whose heartbeat is older than this is marked abandoned.
    abandoned_after: float = 30.0
    batch_size: int = 1000
    poll_interval: float = 1.0
    retry: RetrySettings = field(default_factory=RetrySettings)


def _cursor_of(conn: psycopg.Connection[Any], name: str) -> Cursor:
    current = state.get_cursor(conn, name)
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
    ) -> None:
        self.store = store
        self.projections = {p.name: p for p in projections}
        self.settings = settings or WorkerSettings()
        self.id = worker_id or new_worker_id()
        self.stopping = threading.Event()
        self._runners: dict[str, LiveRunner] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Work until `stop()`; then release every lease."""
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="projector-heartbeat", daemon=True)
        heartbeat.start()
        listener = threading.Thread(target=self._listen_loop, name="projector-listener", daemon=True)
        listener.start()
        log.info("projector_worker_started", worker=self.id, projections=sorted(self.projections))
        horizon_wait = _HORIZON_RECHECK_MIN
        try:
            while not self.stopping.is_set():
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
            heartbeat.join(timeout=5)
            listener.join(timeout=5)
            self.release_all()
            log.info("projector_worker_stopped", worker=self.id)

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    def _waiting_on_horizon(self) -> bool:
        try:
            return self.store.events_beyond_horizon()
        except DatabaseUnavailableError:
            return False

    def prepare(self) -> None:
        """Create every projection's cursor and tables now, so readers can query them before the first
        batch (whichever worker ends up holding the lease)."""
        for projection in self.projections.values():
            with self.store.pool.connection() as conn, conn.transaction():
                state.ensure_cursor(conn, projection.name, projection.version)
                tables.ensure_live_tables(conn, projection)

    def work_once(self) -> bool:
        """Take free leases and apply one batch per held projection. True if there may be more work."""
        try:
            self.acquire_free_leases()
            busy = False
            for name in list(self._runners):
                if self.stopping.is_set():
                    break
                busy |= self._step(name)
            return busy
        except DatabaseUnavailableError as exc:
            log.warning("projector_database_unavailable", error=str(exc))
            self.stopping.wait(self.settings.poll_interval)
            return False

    def run_until_caught_up(self, timeout: float = 60.0) -> None:
        """Work until every projection has applied every event committed before this call (or is
        blocked by a failure). For tests and one-shot CLI use."""
        target = self.store.committed_so_far()
        deadline = time.monotonic() + timeout
        next_heartbeat = time.monotonic() + self.settings.heartbeat_interval
        while time.monotonic() < deadline:
            if time.monotonic() >= next_heartbeat:  # no heartbeat thread here: renew the leases inline
                self.heartbeat()
                next_heartbeat = time.monotonic() + self.settings.heartbeat_interval
            self.acquire_free_leases()
            results = {name: runner.step() for name, runner in list(self._runners.items())}
            if len(results) == len(self.projections) and all(
                r.blocked or (r.caught_up and self._runners[name].read_cursor >= target)
                for name, r in results.items()
            ):
                return
            if not any(r.applied for r in results.values()):
                time.sleep(0.005)  # waiting for the horizon to pass "now": poll, don't spin
        raise TimeoutError(f"projections not caught up within {timeout}s")

    def _step(self, name: str) -> bool:
        runner = self._runners.get(name)
        if runner is None:  # the heartbeat thread found the lease lost meanwhile
            return False
        try:
            result = runner.step()
        except LeaseLost:
            log.warning("projection_lease_lost", projection=name, worker=self.id)
            self._drop(name, "stopped")
            return False
        return not result.caught_up and not result.blocked

    # -- leases ---------------------------------------------------------------------------------------

    def acquire_free_leases(self) -> None:
        for name, projection in self.projections.items():
            if name in self._runners or self.stopping.is_set():
                continue
            with self.store.pool.connection() as conn:
                epoch = state.acquire_lease(conn, name, self.id, self.settings.lease_ttl)
            if epoch is not None:
                self._take(projection, epoch)

    def _take(self, projection: Projection, epoch: int) -> None:
        name = projection.name
        with self.store.pool.connection() as conn, conn.transaction():
            current = state.ensure_cursor(conn, name, projection.version)
            tables.ensure_live_tables(conn, projection)
        log.info("projection_lease_acquired", projection=name, worker=self.id, epoch=epoch)
        if current.version != projection.version:
            log.info(
                "projection_version_changed", projection=name, stored=current.version, code=projection.version
            )
            rebuild(
                self.store,
                projection,
                actor=self.id,
                trigger="version_change",
                batch_size=self.settings.batch_size,
            )
        # The catch-up run ends once everything committed before it began has been applied.
        target = self.store.committed_so_far()
        with self.store.pool.connection() as conn:
            run_id = state.start_run(
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
        )
        with self._lock:
            self._runners[name] = runner

    def _drop(self, name: str, status: state.RunStatus) -> None:
        with self._lock:
            runner = self._runners.pop(name, None)
        if runner is not None:
            try:
                runner.close(status)
            except (psycopg.Error, DatabaseUnavailableError):
                log.warning("projection_run_not_closed", projection=name)

    def release_all(self) -> None:
        for name in list(self._runners):
            runner = self._runners[name]
            try:
                with self.store.pool.connection() as conn:
                    state.release_lease(conn, name, self.id, runner.epoch)
            except psycopg.Error:
                log.warning("projection_lease_not_released", projection=name)
            self._drop(name, "stopped")
            log.info("projection_lease_released", projection=name, worker=self.id)

    def _heartbeat_loop(self) -> None:
        """Renews leases and run heartbeats, and marks other owners' dead runs abandoned."""
        interval = self.settings.heartbeat_interval
        while not self.stopping.wait(interval):
            try:
                self.heartbeat()
            except (psycopg.Error, DatabaseUnavailableError) as exc:
                log.warning("projector_heartbeat_failed", error=str(exc))

    def heartbeat(self) -> None:
        with self.store.pool.connection() as conn:
            for name, runner in list(self._runners.items()):
                if not state.renew_lease(conn, name, self.id, runner.epoch, self.settings.lease_ttl):
                    log.warning("projection_lease_lost", projection=name, worker=self.id)
                    self._drop(name, "stopped")
            state.heartbeat_runs(conn, self.id)
            for run_id, projection, kind, owner in state.mark_abandoned_runs(
                conn, self.settings.abandoned_after
            ):
                log.warning(
                    "projection_run_abandoned", run_id=run_id, projection=projection, kind=kind, owner=owner
                )

    def _listen_loop(self) -> None:
        """Wakes the main loop when events are appended, instead of waiting out the poll interval."""
        while not self.stopping.is_set():
            try:
                with psycopg.connect(
                    self.store.url, autocommit=True, application_name="ledgerflow-projector-listener"
                ) as conn:
                    conn.execute(_EVENTSTORE_Q["listen"])
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._wake.set()
            except psycopg.Error as exc:
                log.warning("projector_listener_lost", error=str(exc))
                self.stopping.wait(1.0)

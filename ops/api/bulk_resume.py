"""The API server works bulk actions that stopped: recorded (by the API or the CLI) but not ended, their
process killed. On start and every `bulk_resume_after` seconds it lists the running actions nothing has
advanced for that long and queues each in its tenant's job lane (ops.api.jobs), as a new action is.

Exactly once: `run_bulk_action` takes the action's lock in each page's transaction (dropped with a
killed process's connection, so there is no lapse to wait for) and leaves at once when another process
holds it or counted the page first; each run is acted on under the action's idempotency key, so a run
acted on before the crash is not acted on again. This process queues an action at most once at a time.

An action's job (`bulk_job`, for a new action too) waits out an outage of the database and goes on where
the action stopped once it answers: a restart of PostgreSQL does not stop it, nor wait for this look.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import structlog

from eventstore import LedgerflowError
from eventstore.spi import Outage, is_unavailable, through_outages
from ops.api.jobs import BackgroundJobs, JobQueueFullError
from ops.services import Services
from workflows import BulkAction, Engine, run_bulk_action, unfinished_bulk_actions

log = structlog.get_logger(__name__)


class BulkResumer:
    def __init__(self, services: Services, jobs: BackgroundJobs) -> None:
        self._services, self._jobs = services, jobs
        self._interval = services.settings.bulk_resume_after
        self._stopping = threading.Event()
        self._queued: dict[uuid.UUID, Future[Any]] = {}
        self._thread: threading.Thread | None = None
        self._outage = Outage(role="bulk_resume")

    def start(self) -> None:
        """Start looking; an app's lifespan may run more than once (a test client entered again), so
        each start has a thread of its own."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="ledgerflow-bulk-resume", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval + 5)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.resume_stopped()
                self._outage.succeeded()
                self._outage.settle(confirmed=True)
            except LedgerflowError as exc:  # the database away: try again at the next tick
                if is_unavailable(exc):
                    self._outage.failed(exc)  # one warning per outage, not one per tick
                else:
                    log.warning("bulk_resume_failed", error=str(exc))
            self._stopping.wait(self._interval)

    def resume_stopped(self) -> int:
        """Queue every stopped action not queued here already; how many were queued."""
        self._queued = {k: f for k, f in self._queued.items() if not f.done()}
        engine, queued = self._services.engine, 0
        for action in unfinished_bulk_actions(self._services.store, idle_seconds=self._interval):
            if action.id in self._queued:
                continue
            try:
                with self._jobs.reserve(action.tenant) as place:
                    self._queued[action.id] = place.submit(
                        f"bulk_{action.kind}",
                        bulk_job(engine, self._jobs, action.id, action.tenant),
                        bulk_id=str(action.id),
                    )
            except JobQueueFullError:
                continue  # the tenant's lane is busy: its turn comes at a later tick
            queued += 1
            log.info("bulk_action_resumed", bulk_id=str(action.id), tenant=action.tenant, kind=action.kind)
        return queued


def bulk_job(
    engine: Engine, jobs: BackgroundJobs, action_id: uuid.UUID, tenant: str
) -> Callable[[], BulkAction]:
    """A job that works the action to its end, waiting out the database's outages on the way: the action
    resumes from its recorded progress once the database answers again (no run acted on twice), within
    the same job, so a restart of PostgreSQL costs its duration. An API shutting down stops the wait;
    the next server resumes the action."""
    store = engine.store

    def work() -> BulkAction:
        outage = Outage(bulk_id=str(action_id), tenant=tenant)  # the job's name is bound to its log
        return through_outages(
            lambda: run_bulk_action(engine, action_id, tenant=tenant), store.pool, outage, jobs.stopping
        )

    return work

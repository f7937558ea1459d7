"""The API server works bulk actions that stopped: recorded (by the API or the CLI) but not ended, their
process killed. On start and every `bulk_resume_after` seconds it lists the running actions nothing has
advanced for that long and queues each in its tenant's job lane (ops.api.jobs), as a new action is.

Exactly once: `run_bulk_action` takes the action's session lock (its lease, dropped with a killed
process's connection, so there is no lapse to wait for) and leaves at once when another process holds it;
each run is acted on under the action's idempotency key, so a run acted on before the crash is not acted
on again. This process queues an action at most once at a time.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import structlog

from eventstore import LedgerflowError
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
            except LedgerflowError as exc:  # the database away: try again at the next tick
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
                        f"bulk_{action.kind}", _work(engine, action), bulk_id=str(action.id)
                    )
            except JobQueueFullError:
                continue  # the tenant's lane is busy: its turn comes at a later tick
            queued += 1
            log.info("bulk_action_resumed", bulk_id=str(action.id), tenant=action.tenant, kind=action.kind)
        return queued


def _work(engine: Engine, action: BulkAction) -> Callable[[], BulkAction]:
    return lambda: run_bulk_action(engine, action.id, tenant=action.tenant)

"""Long operator jobs (rebuild, verify, replay) run in background threads, so their request returns at once.

Jobs queue per tenant, fairly: at most one job of a tenant runs at a time, a free thread takes the server
administrator's queue first and then the tenants' in turn (round robin), so one tenant's slow or many
jobs never keep another tenant's job from starting. A tenant's queue is bounded
(`LEDGERFLOW_API_MAX_QUEUED_JOBS`): past it the request is refused with 429 and `Retry-After`, before
anything is recorded.

Each job records itself as a projection run, where callers follow it; the outcome is logged too. On
shutdown the API waits for running and queued jobs: a rebuild stopped half-way would be recorded as failed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from eventstore import LedgerflowError
from eventstore.spi import is_unavailable
from ops.api.lines import TenantLines

log = structlog.get_logger(__name__)

#: The server administrator's lane (a tenant's lane is its name).
SERVER: Final = None
Lane = str | None


class JobQueueFullError(LedgerflowError):
    """The tenant's job queue is full (HTTP 429 with Retry-After); nothing was recorded."""

    code = "job_queue_full"

    def __init__(self, lane: Lane, limit: int, retry_after: int) -> None:
        self.lane, self.limit, self.retry_after = lane, limit, retry_after
        whose = "the server administrator's" if lane is SERVER else f"tenant {lane!r}'s"
        super().__init__(
            f"{whose} operator job queue is full ({limit} jobs waiting, LEDGERFLOW_API_MAX_QUEUED_JOBS); "
            f"nothing was recorded: ask again in {retry_after}s, or follow the queued runs first"
        )

    def details(self) -> dict[str, Any]:
        return {"queued": self.limit, "retry_after": self.retry_after}


@dataclass
class _Job:
    run: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


class Reservation:
    """Room in a lane's queue, found before the job's run is recorded; `submit` queues the job."""

    def __init__(self, jobs: BackgroundJobs, lane: Lane) -> None:
        self._jobs, self.lane = jobs, lane

    def submit(self, name: str, job: Callable[[], Any], **context: Any) -> Future[Any]:
        return self._jobs._enqueue(self.lane, name, job, context)


class BackgroundJobs:
    def __init__(self, threads: int = 2, max_queued: int = 8, retry_after: int = 5) -> None:
        self.max_queued, self.retry_after = max_queued, retry_after
        self._cond = threading.Condition()
        # Per lane: its running job (at most one) and its queue (`lines.TenantLines`, under `_cond`).
        self._lanes: TenantLines[Lane, _Job] = TenantLines(limit=1, max_queued=max_queued)
        self._turns: deque[str] = deque()  # tenants with queued jobs, in the order they get a thread
        self._closing = False
        #: Set when the API shuts down: a job that waits (for the database, say) stops waiting.
        self.stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, name=f"ledgerflow-api-job-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    @contextmanager
    def reserve(self, lane: Lane) -> Iterator[Reservation]:
        """Room in `lane`'s queue, or JobQueueFullError, checked before the caller records its run.

        Not held while the run is recorded: requests in flight together (most of which then meet a running
        run and get 409) are not refused for each other. So the bound can be passed by the requests of a
        lane in flight at one moment, each of which has recorded a run of its own."""
        with self._cond:
            if self._lanes.full(lane):
                log.warning("api_job_queue_full", lane=lane, queued=self._lanes.waiting(lane))
                raise JobQueueFullError(lane, self.max_queued, self.retry_after)
        yield Reservation(self, lane)

    def submit(
        self, name: str, job: Callable[[], Any], *, lane: Lane = SERVER, **context: Any
    ) -> Future[Any]:
        """Queue `job` in `lane` (bounded: JobQueueFullError when full)."""
        with self.reserve(lane) as place:
            return place.submit(name, job, **context)

    def _enqueue(self, lane: Lane, name: str, job: Callable[[], Any], context: dict[str, Any]) -> Future[Any]:
        # The submitting request's log context (request id, token) follows the job into its thread.
        bound = {**structlog.contextvars.get_contextvars(), **context, "job": name, "lane": lane}

        def run() -> Any:
            with structlog.contextvars.bound_contextvars(**bound):
                log.info("api_job_started")
                try:
                    result = job()
                except BaseException as exc:
                    if is_unavailable(exc):  # an outage, reported where it began: no traceback
                        log.warning("api_job_failed", error=str(exc), reason="database_unavailable")
                    else:
                        log.exception("api_job_failed")
                    raise
                log.info("api_job_finished")
                return result

        queued = _Job(run)
        with self._cond:
            if self._closing:
                raise RuntimeError("the API is shutting down")
            # A lane with queued jobs is in the turns already (or gets back in when its job ends).
            if lane is not SERVER and lane not in self._turns:
                self._turns.append(lane)
            self._lanes.join(lane, queued)
            log.info("api_job_queued", job=name, lane=lane, queued=self._lanes.waiting(lane))
            self._cond.notify()
        return queued.future

    def _next(self) -> tuple[Lane, _Job] | None:
        """Under the condition: the job a free thread takes, or None. The server administrator's first,
        then the next tenant in turn whose own job is not running."""
        job = self._lanes.take_next(SERVER)
        if job is not None:
            return SERVER, job
        for _ in range(len(self._turns)):
            tenant = self._turns.popleft()
            job = self._lanes.take_next(tenant)
            if self._lanes.waiting(tenant):
                self._turns.append(tenant)  # its next job waits for every other tenant's turn
            if job is not None:
                return tenant, job
        return None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while (picked := self._next()) is None:
                    if self._closing and not self._lanes.anyone_waiting():
                        return
                    self._cond.wait()
                lane, job = picked
            try:
                if job.future.set_running_or_notify_cancel():
                    try:
                        job.future.set_result(job.run())
                    except BaseException as exc:
                        job.future.set_exception(exc)
            finally:
                with self._cond:
                    self._lanes.release(lane)  # the lane's next job waits for a thread, in turn
                    if self._lanes.waiting(lane) and lane is not SERVER and lane not in self._turns:
                        self._turns.append(lane)
                    self._cond.notify_all()

    def shutdown(self) -> None:
        """Wait for every running and queued job."""
        self.stopping.set()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()

"""Long operator jobs (rebuild, verify) run in background threads, so their request returns at once.

Each job records itself as a projection run, where callers follow it; the outcome is logged too. On
shutdown the API waits for running jobs: a rebuild stopped half-way would be recorded as failed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class BackgroundJobs:
    def __init__(self, max_workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ledgerflow-api-job")

    def submit(self, name: str, job: Callable[[], Any], **context: Any) -> Future[Any]:
        # The submitting request's log context (request id, token) follows the job into its thread.
        bound = {**structlog.contextvars.get_contextvars(), **context, "job": name}

        def run() -> Any:
            with structlog.contextvars.bound_contextvars(**bound):
                log.info("api_job_started")
                try:
                    result = job()
                except BaseException:
                    log.exception("api_job_failed")
                    raise
                log.info("api_job_finished")
                return result

        return self._pool.submit(run)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

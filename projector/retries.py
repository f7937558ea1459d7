"""How a projection's failing batch is retried before its failure is kept: the settings, the error a
handler's failure travels in, and the retry loop (exponential back-off, tenacity)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tenacity

from eventstore import RecordedEvent


@dataclass(frozen=True)
class RetrySettings:
    """How often a failing batch or event is retried before it becomes a failure record."""

    attempts: int = 3
    initial_backoff: float = 0.05
    max_backoff: float = 2.0


class HandlerFailed(Exception):
    """A projection's handler raised `error` (at `event`, when known); the batch's transaction rolled back."""

    def __init__(self, error: BaseException, event: RecordedEvent | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.event = event


def with_retries(settings: RetrySettings, attempt: Callable[[], None]) -> None:
    """Run `attempt`, again after each HandlerFailed with exponential back-off; then raise the last one."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(HandlerFailed),
        stop=tenacity.stop_after_attempt(settings.attempts),
        wait=tenacity.wait_exponential(multiplier=settings.initial_backoff, max=settings.max_backoff),
        reraise=True,
    )
    for try_ in retrying:
        with try_:
            attempt()

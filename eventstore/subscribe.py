"""Following the log: a subscription that never loses an event.

It reads the global log gap-free from a cursor. When caught up it waits for a wake-up (LISTEN on
`ledgerflow_events`) or, at the latest, the poll interval. After every (re)connection it reads again
before waiting, so a notification lost while disconnected costs nothing. When committed events wait
behind an older running transaction, it re-reads soon, since that transaction may never notify.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import structlog

from eventstore.errors import DatabaseUnavailableError
from eventstore.events import START, Cursor, ReadPage, RecordedEvent
from eventstore.sqlfile import load_queries
from eventstore.store import EventStore

log = structlog.get_logger(__name__)
Q = load_queries("eventstore")

_HORIZON_RECHECK_MIN = 0.005
_RECONNECT_MAX = 5.0
_STOP_CHECK = 0.25


class Subscription:
    def __init__(
        self,
        store: EventStore,
        url: str,
        after: Cursor = START,
        *,
        tenant: str | None = None,
        types: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
        batch_size: int = 500,
        poll_interval: float = 1.0,
    ) -> None:
        self.store = store
        self.cursor = after
        self._url = url
        self._filters: dict[str, Any] = {"tenant": tenant, "types": types, "categories": categories}
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._stopped = threading.Event()
        self._listener: psycopg.Connection[Any] | None = None

    def stop(self) -> None:
        """Stop after the current wait; safe to call from another thread."""
        self._stopped.set()

    def __iter__(self) -> Iterator[RecordedEvent]:
        for page in self.pages():
            yield from page.events

    def pages(self) -> Iterator[ReadPage]:
        """Pages of new events, forever (until `stop`). `self.cursor` is where the next page starts."""
        failures = 0
        horizon_wait = _HORIZON_RECHECK_MIN
        try:
            while not self._stopped.is_set():
                try:
                    self._ensure_listening()
                    page = self.store.read_all(self.cursor, limit=self._batch_size, **self._filters)
                    failures = 0
                except DatabaseUnavailableError as exc:
                    failures += 1
                    self._drop_listener()
                    delay = min(_RECONNECT_MAX, 0.1 * 2**failures)
                    log.warning("subscription_reconnecting", error=str(exc), retry_in=delay)
                    self._stopped.wait(delay)
                    continue
                self.cursor = page.cursor
                if page.events:
                    horizon_wait = _HORIZON_RECHECK_MIN
                    yield page
                if not page.caught_up:
                    continue
                if self.store.events_beyond_horizon():
                    # Another transaction holds the horizon; it may not be an appender that notifies.
                    self._wait(horizon_wait)
                    horizon_wait = min(horizon_wait * 2, self._poll_interval)
                else:
                    self._wait(self._poll_interval)
        finally:
            self._drop_listener()

    def _ensure_listening(self) -> None:
        if self._listener is not None and not self._listener.closed:
            return
        try:
            self._listener = psycopg.connect(
                self._url, autocommit=True, application_name="ledgerflow-subscriber"
            )
            self._listener.execute(Q["listen"])
        except psycopg.Error as exc:
            self._drop_listener()
            raise DatabaseUnavailableError(f"could not listen for wake-ups: {exc}") from exc

    def _wait(self, timeout: float) -> None:
        listener = self._listener
        if listener is None:
            self._stopped.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        try:
            # Waits in short slices so that `stop()` is noticed promptly. Returns at the first
            # notification; those queued behind it are covered by the read that follows.
            while not self._stopped.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in listener.notifies(timeout=min(left, _STOP_CHECK), stop_after=1):
                    return
        except psycopg.Error as exc:
            log.warning("subscription_listener_lost", error=str(exc))
            self._drop_listener()

    def _drop_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None

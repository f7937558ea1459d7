"""Following the log: a subscription that never loses an event.

It reads the global log gap-free from a cursor. When caught up it waits for a wake-up (the `Waker` that
workers use too: LISTEN on `ledgerflow_events`) or, at the latest, the poll interval. After every
(re)connection of the waker it reads again before waiting, so a notification lost while disconnected
costs nothing. When committed events wait behind an older running transaction, it re-reads soon, since
that transaction may never notify. A database outage is reported once and waited out with back-off
(`eventstore.outage`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import structlog

from eventstore.errors import DatabaseUnavailableError
from eventstore.events import START, Cursor, ReadPage, RecordedEvent
from eventstore.keepalive import Waker
from eventstore.outage import Outage, wait_until_available
from eventstore.store import EventStore

log = structlog.get_logger(__name__)

_HORIZON_RECHECK_MIN = 0.005


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
        upcast: bool = True,
    ) -> None:
        self.store = store
        self.cursor = after
        self._url = url
        self._filters: dict[str, Any] = {"tenant": tenant, "types": types, "categories": categories}
        self._filters["upcast"] = upcast  # events in their type's latest shape (eventstore.eventtypes)
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self.outage = Outage(role="subscription")

    def stop(self) -> None:
        """Stop after the current wait; safe to call from another thread."""
        self._stopped.set()
        self._wake.set()

    def __iter__(self) -> Iterator[RecordedEvent]:
        for page in self.pages():
            yield from page.events

    def pages(self) -> Iterator[ReadPage]:
        """Pages of new events, forever (until `stop`). `self.cursor` is where the next page starts."""
        horizon_wait = _HORIZON_RECHECK_MIN
        waker = Waker(self._url, self._wake, self.outage, application_name="ledgerflow-subscriber")
        waker.start()
        try:
            while not self._stopped.is_set():
                if self.outage.failing() and not wait_until_available(
                    self.store.pool, self.outage, self._stopped
                ):
                    break
                try:
                    page = self.store.read_all(self.cursor, limit=self._batch_size, **self._filters)
                    self.cursor = page.cursor
                    if page.events:
                        horizon_wait = _HORIZON_RECHECK_MIN
                        yield page
                    if not page.caught_up:
                        continue
                    # Another transaction may hold the horizon; it may not be an appender that notifies.
                    behind_horizon = self.store.events_beyond_horizon()
                except DatabaseUnavailableError as exc:
                    self.outage.failed(exc)
                    continue
                if behind_horizon:
                    self._wait(horizon_wait)
                    horizon_wait = min(horizon_wait * 2, self._poll_interval)
                else:
                    self._wait(self._poll_interval)
        finally:
            waker.stop()

    def _wait(self, timeout: float) -> None:
        """Until a wake-up (an append, the waker reconnected, `stop`) or `timeout`. Wake-ups that came
        while reading are kept, so none is lost between a read and this wait."""
        self._wake.wait(timeout)
        self._wake.clear()

"""Keeping a worker's leases alive and waking it when events are appended: one mechanism for every kind.

`Waker` holds one LISTEN connection in its own thread and sets an event on every notification, and
after every (re)connection, since a notification sent while disconnected is lost (readers re-read
then). `Keepalive` adds the beats: callables run on a schedule (lease renewals, sweeps) in a second
thread, so a lost listener never delays a renewal. Both report database trouble to the worker's
`Outage` (one warning per outage) and reconnect with tenacity's back-off; neither ever ends before
`stop()`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
import tenacity

from eventstore.db import connect
from eventstore.outage import Outage, backoff, is_unavailable, sleeper, slots_full
from eventstore.sqlfile import load_queries

log = structlog.get_logger(__name__)
_LISTEN = load_queries("eventstore")["listen"]
#: How long one wait for notifications lasts: the longest `stop()` waits for the listener to notice (a
#: worker stops two in a row). A wait that ends without a notification costs a wake of the thread, no
#: round trip.
_SLICE = 0.1
_CONNECT_TIMEOUT = 3


class _ListenerLost(Exception):
    """The LISTEN connection failed; the waker connects again after a back-off."""


class Waker:
    """Sets `wake` whenever events are appended (and after every reconnection)."""

    def __init__(
        self,
        url: str,
        wake: threading.Event,
        outage: Outage,
        *,
        application_name: str = "ledgerflow-listener",
        make_room: Callable[[], int] | None = None,
    ) -> None:
        self._url = url
        self._wake = wake
        self._outage = outage
        self._application_name = application_name
        self._make_room = make_room
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._application_name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(_ListenerLost),
                wait=backoff(),
                stop=tenacity.stop_when_event_set(self._stopping),
                sleep=sleeper(self._stopping),
                reraise=True,
            )
            try:
                for attempt in retrying:
                    with attempt:
                        self._listen()
            except _ListenerLost:
                continue  # stopping

    def _connect(self) -> psycopg.Connection[Any]:
        """The listening connection. A server without a free slot is asked once more right away if the
        process's own pool closed idle connections to make room (`make_room`): a listener is what wakes
        the process, and in the budget its slot comes before an idle pooled one; without it the process
        would wait for its back-off while its idle pool kept the slots it needs."""
        for again in (True, False):
            try:
                # With the network timeouts: a partition ends the LISTEN too, not only queries.
                return connect(
                    self._url,
                    autocommit=True,
                    application_name=self._application_name,
                    connect_timeout=_CONNECT_TIMEOUT,
                )
            except psycopg.OperationalError as exc:
                if not (again and slots_full(exc) and self._make_room is not None and self._make_room() > 0):
                    raise
        raise AssertionError("unreachable")

    def _listen(self) -> None:
        """Listen until stopped; raise _ListenerLost when the connection fails."""
        try:
            with self._connect() as conn:
                conn.execute(_LISTEN)
                self._outage.succeeded("listener")
                self._wake.set()  # anything appended while this waker was away is read now
                while not self._stopping.is_set():
                    for _ in conn.notifies(timeout=_SLICE, stop_after=1):
                        self._wake.set()
                    self._outage.settle()
        except psycopg.Error as exc:
            if not is_unavailable(exc):
                log.warning("listener_failed", error=str(exc))
            self._outage.failed(exc, "listener")
            raise _ListenerLost from exc


@dataclass(frozen=True)
class Beat:
    """`fn` runs every `interval` seconds in the keepalive thread."""

    name: str
    interval: float
    fn: Callable[[], Any]


class Keepalive:
    """A worker's waker and its beats. A beat that hits an outage is reported and tried again at its
    next time; any other exception is logged and the beat goes on."""

    def __init__(
        self,
        url: str,
        wake: threading.Event,
        outage: Outage,
        beats: Sequence[Beat] = (),
        *,
        application_name: str = "ledgerflow-listener",
        make_room: Callable[[], int] | None = None,
    ) -> None:
        self.waker = Waker(url, wake, outage, application_name=application_name, make_room=make_room)
        self._beats = list(beats)
        self._outage = outage
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.waker.start()
        if self._beats and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledgerflow-keepalive", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self.waker.stop(timeout)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        due = [time.monotonic() + b.interval for b in self._beats]
        while not self._stopping.is_set():
            now = time.monotonic()
            for i, beat in enumerate(self._beats):
                if now >= due[i]:
                    self.run_beat(beat)
                    due[i] = time.monotonic() + beat.interval
            self._stopping.wait(max(0.0, min(due) - time.monotonic()))

    def run_beat(self, beat: Beat) -> None:
        try:
            beat.fn()
        except Exception as exc:
            if is_unavailable(exc):
                self._outage.failed(exc)
            else:
                log.exception("keepalive_beat_failed", beat=beat.name)

"""Waking subscribers without slowing appenders down.

A NOTIFY inside an appending transaction takes a database-wide lock at commit and serialises every
appender behind it. Instead, appenders only poke a `Notifier` after their commit; its own thread sends
one NOTIFY for all the pokes that arrived while the previous one was in flight, and at most one every
few milliseconds (a NOTIFY per sequential append would cost each append a second transaction). Its
connection uses `synchronous_commit = off`: a lost wake-up is harmless, because subscribers also poll
and re-read after every reconnect.

The connection is closed once no wake-up was sent for `max_idle` seconds, as the pool closes its idle
connections (`eventstore.pooling`), and opened again at the next one. Kept for good, it held a server slot
that the process's pool could need more: on a server with fewer slots than a fleet asks for, the idle
notifiers of its processes once held the slots that every process's pool waited for, and no run moved.
"""

from __future__ import annotations

import threading
import time

import psycopg
import structlog

from eventstore.db import connect
from eventstore.outage import is_unavailable, retry_delay, slots_full
from eventstore.sqlfile import load_queries

log = structlog.get_logger(__name__)

Q = load_queries("eventstore")
_NOTIFY = Q["notify"].encode()
_MIN_INTERVAL = 0.005


def _notify(conn: psycopg.Connection[object]) -> None:
    """Send the wake-up through libpq directly: a quarter of the client CPU of a psycopg statement,
    which counts, as the notifier shares the process (and its GIL) with the appenders. The GIL is
    released while libpq waits."""
    result = conn.pgconn.exec_(_NOTIFY)
    if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
        message = (result.error_message or b"").decode(errors="replace").strip() or "NOTIFY failed"
        if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
            raise psycopg.OperationalError(message)
        raise psycopg.DatabaseError(message)


class Notifier:
    def __init__(self, url: str, *, max_idle: float) -> None:
        self._url = url
        #: Seconds without a wake-up after which the connection is closed (see the module).
        self._max_idle = max_idle
        self._pending = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_sent = 0.0

    def poke(self) -> None:
        """Ask for a wake-up of subscribers; never blocks."""
        # Already pending: the NOTIFY that follows the thread's clearing of the flag covers this append,
        # committed before this call. Setting it again would only take the event's lock at every append.
        if not self._pending.is_set():
            self._pending.set()
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="ledgerflow-notifier", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        conn: psycopg.Connection[object] | None = None
        failures = 0
        while not self._stopping.is_set():
            self._pending.wait(timeout=min(1.0, self._max_idle))
            if self._stopping.is_set():
                continue
            if not self._pending.is_set():
                if conn is not None and time.monotonic() - self._last_sent >= self._max_idle:
                    conn.close()
                    conn = None
                continue
            self._pending.clear()
            # Let pokes gather for a moment: subscribers wake a few ms later, appenders pay less.
            since = time.monotonic() - self._last_sent
            if since < _MIN_INTERVAL:
                self._stopping.wait(_MIN_INTERVAL - since)
            self._last_sent = time.monotonic()
            try:
                if conn is None or conn.closed:
                    conn = connect(self._url, autocommit=True, application_name="ledgerflow-notifier")
                    conn.execute("SET synchronous_commit = off")
                _notify(conn)
                failures = 0
            except psycopg.Error as exc:
                # Subscribers poll as a fallback, so a failed wake-up delays them but loses nothing; an
                # unavailable database is reported by whoever waits for it, not once per wake-up here.
                if is_unavailable(exc):
                    log.debug("notify_failed", error=str(exc))
                else:
                    log.warning("notify_failed", error=str(exc))
                if conn is not None:
                    conn.close()
                conn = None
                # A full server is not asked for a connection at every append's wake-up: back off.
                failures = failures + 1 if slots_full(exc) else 0
                self._stopping.wait(max(0.5, retry_delay(failures, exc)) if failures else 0.5)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._stopping.set()
        self._pending.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

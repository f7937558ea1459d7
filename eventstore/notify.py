"""Waking subscribers without slowing appenders down.

A NOTIFY inside an appending transaction takes a database-wide lock at commit and serialises every
appender behind it. Instead, a wake-up is sent after the append committed, in a transaction of its own,
at most one every few milliseconds (a NOTIFY per sequential append would cost each append a second
transaction), covering every append committed before it. Its transaction uses `synchronous_commit = off`:
a lost wake-up is harmless, because subscribers also poll and re-read after every reconnect.

Who sends it: an appender on a connection of its own (a pinned one, `eventstore.pinning`) whose append
committed once the interval since the last wake-up has passed sends it itself, on that connection, right
after its append (`claim`): a statement on a backend that is busy anyway, without waking a thread. Every
other append pokes the `Notifier`'s thread (`poke`), which sends the wake-up no later than the interval
after the first append it has not seen covered, unless an appender's came first. The bound on a
subscriber's wake-up is the same either way: the interval after the append's commit.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import structlog

from eventstore.db import connect
from eventstore.outage import is_unavailable, retry_delay, slots_full
from eventstore.sqlfile import load_queries

log = structlog.get_logger(__name__)

Q = load_queries("eventstore")
_NOTIFY = Q["notify"].encode()
#: The wake-up as an appender sends it on its own connection: the same NOTIFY in one implicit transaction
#: with a transaction-local `synchronous_commit = off` (its commit waits for no disk flush, and nothing is
#: left set on the connection).
_NOTIFY_INLINE = Q["notify_inline"].encode()
_MIN_INTERVAL = 0.005


def _notify(conn: psycopg.Connection[Any], query: bytes = _NOTIFY) -> None:
    """Send the wake-up through libpq directly: a quarter of the client CPU of a psycopg statement,
    which counts, as the notifier shares the process (and its GIL) with the appenders. The GIL is
    released while libpq waits."""
    result = conn.pgconn.exec_(query)
    if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
        message = (result.error_message or b"").decode(errors="replace").strip() or "NOTIFY failed"
        if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
            raise psycopg.OperationalError(message)
        raise psycopg.DatabaseError(message)


class Notifier:
    def __init__(self, url: str) -> None:
        self._url = url
        self._pending = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: When the last wake-up was claimed (`time.monotonic()`): it covers every append committed before.
        self._last_sent = 0.0
        #: When the first append not covered by a wake-up poked, or None when every append is covered.
        #: Set under `_lock` (by the first poke after a wake-up), cleared under it when one is claimed.
        self._uncovered: float | None = None

    def poke(self) -> None:
        """Ask for a wake-up of subscribers, for an append that committed; never blocks."""
        # Already set: a wake-up not yet claimed is due at that earlier time; it is claimed after this
        # append committed (it is claimed after this read), so it covers this append too.
        if self._uncovered is None:
            with self._lock:
                if self._uncovered is None:
                    self._uncovered = time.monotonic()
            self._pending.set()
        if self._thread is None:
            self._start()

    def claim(self) -> bool:
        """For an appender whose append has just committed, on a connection of its own: whether it is to
        send the wake-up itself, now, on that connection (`send_inline`). True once the interval since the
        last wake-up has passed; the wake-up then counts as sent, covering every append committed so far.
        When False, the caller pokes instead."""
        if time.monotonic() - self._last_sent < _MIN_INTERVAL:
            return False
        with self._lock:
            now = time.monotonic()
            if now - self._last_sent < _MIN_INTERVAL:
                return False
            self._last_sent = now
            self._uncovered = None
        return True

    def send_inline(self, conn: psycopg.Connection[Any]) -> None:
        """Send the wake-up `claim` granted on the appender's `conn`. It never raises: the append it
        follows committed. If it fails, the thread sends it instead, within the interval."""
        try:
            _notify(conn, _NOTIFY_INLINE)
        except psycopg.Error as exc:
            log.debug("notify_inline_failed", error=str(exc))
            self.poke()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="ledgerflow-notifier", daemon=True)
                self._thread.start()

    def _claim_uncovered(self, first: float) -> bool:
        """The thread's claim of the wake-up due for the first uncovered append, which poked at `first`:
        False if an appender sent one since (which covered it); then, should later appends be uncovered,
        the thread is to wait for theirs."""
        with self._lock:
            if self._uncovered is None:
                return False
            if self._uncovered != first:
                self._pending.set()
                return False
            self._last_sent = time.monotonic()
            self._uncovered = None
        return True

    def _run(self) -> None:
        conn: psycopg.Connection[object] | None = None
        failures = 0
        while not self._stopping.is_set():
            self._pending.wait(timeout=1.0)
            if self._stopping.is_set() or not self._pending.is_set():
                continue
            self._pending.clear()
            first = self._uncovered
            if first is None:
                continue  # covered by an appender's wake-up
            # Let pokes gather for a moment: subscribers wake a few ms later, appenders pay less. Until the
            # interval after the first uncovered append; an appender that finds the interval since the last
            # wake-up passed before then sends it itself.
            left = max(first, self._last_sent) + _MIN_INTERVAL - time.monotonic()
            if left > 0:
                self._stopping.wait(left)
            if not self._claim_uncovered(first):
                continue
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

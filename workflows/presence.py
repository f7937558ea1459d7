"""A worker process's presence in the database, and the watch for peers that are gone.

While a worker process lives it holds a session-level advisory lock on a connection of its own, and a
row in `ledgerflow.worker_presence` says the lock can be trusted. A crash closes the session and
PostgreSQL releases the lock at once; peers check a few times a second (one cheap query on their own
presence connection) and, when a registered process's lock is gone (or a lease lapsed), call
`on_orphans`, which takes its nodes over (`workflows.recovery.take_back` or `sweep`) within a second
instead of at the end of its leases.

What does not close the session does not end the presence: a paused process (SIGSTOP), a slow network
or a busy database leave the lock held, and the lease stays the fallback for a worker that hangs or is
cut off while its session lives. A session that is closed while its process lives (an operator
terminating the backend) reads as a crash: peers take its nodes over and fencing keeps the live process
from writing for them; its presence is registered again at once.

Behind a transaction-mode pooler (PgBouncer) a session lock is held by whichever backend ran the
statement, not by this process. The presence checks for it, when it registers (another connection must
see the lock held by a backend other than its own) and at every watch (its connection must still be on
the backend that took the lock); when either fails it deregisters, says so once, and the process is
taken over only when its leases lapse. It still takes dead peers over. (Heuristic: a pooler that keeps
handing this client the same backend passes both checks until it moves it; the watch then notices
within one interval.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psycopg
import structlog
from psycopg.rows import class_row

from eventstore.spi import (
    connect,
    fetch_all,
    fetch_value,
    fetch_values,
    is_unavailable,
    load_queries,
    retry_delay,
    slots_full,
)

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "recovery.sql")
#: How often peers are checked: one query on a connection already open, about 0.05 ms of server time
#: (tries on the lock manager, no scan of pg_locks).
WATCH_INTERVAL = 0.2
_CONNECT_TIMEOUT = 3


class PresenceMode(StrEnum):
    #: Not registered (yet): peers take this process's nodes over when its leases lapse.
    LEASES = "leases"
    #: Registered, lock held: peers take its nodes over as soon as its session closes.
    SESSION = "session"
    #: Session locks cannot be trusted here (transaction-mode pooler): leases only, for good.
    POOLED = "pooled"


@dataclass(frozen=True)
class _Registration:
    lock_key: int
    backend_pid: int


@dataclass(frozen=True)
class _Watch:
    still_held: bool
    orphans: bool


class Presence:
    """Hold this process's presence and watch the peers'. `start()` registers before it returns, so a
    worker that starts its presence before claiming never holds a node without it."""

    def __init__(
        self,
        url: str,
        *,
        worker_name: str,
        instance: str,
        on_orphans: Callable[[], object],
        interval: float = WATCH_INTERVAL,
    ) -> None:
        self._url = url
        self._worker_name = worker_name
        self._instance = instance
        self._on_orphans = on_orphans
        self._interval = interval
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._registration: _Registration | None = None
        self._pooled = False
        self._unavailable = False
        self._last_error: BaseException | None = None

    @property
    def mode(self) -> PresenceMode:
        if self._pooled:
            return PresenceMode.POOLED
        return PresenceMode.SESSION if self._registration is not None else PresenceMode.LEASES

    def start(self) -> None:
        self._try(self._register)
        self._thread = threading.Thread(target=self._run, name="ledgerflow-presence", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Deregister (peers then do not read the stop as a crash) and close the session."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if self._registration is not None:
                    conn.execute(Q["presence_deregister"], {"instance": self._instance})
            except psycopg.Error as exc:
                if not is_unavailable(exc):
                    raise
            finally:
                self._registration = None
                conn.close()
        log.info("workflow_presence_stopped", instance=self._instance)

    # -- the watch ------------------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stopping.wait(self._next_wait(failures)):
            if self._try(self.watch_once):
                self._take_over()
            failures = failures + 1 if self._unavailable else 0

    def _next_wait(self, failures: int) -> float:
        """The watch interval; after failures in a row for want of a free slot, the back-off of a full
        server (see `retry_delay`): it is not asked for a connection five times a second (peers rely on
        this process's leases meanwhile). A server that is away is tried every interval, so that the
        presence is back as soon as it is."""
        if not failures or not slots_full(self._last_error):
            return self._interval
        return max(self._interval, retry_delay(failures, self._last_error))

    def watch_once(self) -> bool:
        """One check: register again if the presence was lost; True when there are orphans to take
        back (a registered peer is gone, or a lease lapsed)."""
        if self._stopping.is_set():
            return False  # never register again once stopping
        if self._conn is None or self._conn.closed:
            self._register()
        conn = self._conn
        assert conn is not None
        if self._registration is None:
            return bool(fetch_value(conn, Q["presence_watch_only"], {"instance": self._instance}))
        with conn.cursor(row_factory=class_row(_Watch)) as cur:
            watch = cur.execute(
                Q["presence_watch"],
                {
                    "instance": self._instance,
                    "backend_pid": self._registration.backend_pid,
                },
            ).fetchone()
        assert watch is not None
        if not watch.still_held:
            self._fall_back_to_leases("the presence lock is no longer held by this connection's backend")
        return watch.orphans

    def _take_over(self) -> None:
        # Kept apart from the presence connection: a failed takeover must never end this presence.
        try:
            self._on_orphans()
        except Exception as exc:
            if not is_unavailable(exc):
                log.exception("workflow_takeover_failed", instance=self._instance, error=str(exc))

    def _try(self, step: Callable[[], bool | None]) -> bool:
        """`step()`; a database outage closes the presence connection (registered again when the
        database answers: until then peers fall back to this process's leases) and is reported once."""
        try:
            result = bool(step())
            if self._unavailable:
                self._unavailable = False
                log.info("workflow_presence_restored", instance=self._instance, mode=self.mode.value)
            return result
        except Exception as exc:
            if not is_unavailable(exc):
                log.exception("workflow_presence_failed", instance=self._instance, error=str(exc))
            elif not self._unavailable:
                log.warning("workflow_presence_unavailable", instance=self._instance, error=str(exc))
            self._unavailable = True
            self._last_error = exc
            self._drop_connection()
            return False

    # -- registering ----------------------------------------------------------------------------------

    def _register(self) -> None:
        self._drop_connection()
        conn = connect(
            self._url,
            autocommit=True,
            application_name="ledgerflow-presence",
            connect_timeout=_CONNECT_TIMEOUT,
        )
        self._conn = conn
        if self._pooled:
            return  # watch only
        with conn.cursor(row_factory=class_row(_Registration)) as cur:
            registration = cur.execute(
                Q["presence_register"], {"instance": self._instance, "worker_name": self._worker_name}
            ).fetchone()
        if registration is None:
            return  # the key was in use (the sequence cycled onto a live one): the next watch tries again
        self._registration = registration
        if not self._seen_by_others(registration):
            self._fall_back_to_leases("another connection does not see the lock held by a backend of its own")
            return
        log.info(
            "workflow_presence_registered",
            instance=self._instance,
            lock_key=registration.lock_key,
            backend_pid=registration.backend_pid,
        )
        namesakes = fetch_values(
            conn, Q["presence_namesakes"], {"instance": self._instance, "worker_name": self._worker_name}
        )
        if namesakes:
            log.warning(
                "worker_name_in_use",
                worker_name=self._worker_name,
                instance=self._instance,
                others=namesakes,
                advice="give each worker process a name of its own (--name), so logs and the console "
                "tell them apart",
            )

    def _seen_by_others(self, registration: _Registration) -> bool:
        with connect(
            self._url,
            autocommit=True,
            application_name="ledgerflow-presence-check",
            connect_timeout=_CONNECT_TIMEOUT,
        ) as probe:
            seen = fetch_value(
                probe,
                Q["presence_seen_by_others"],
                {"lock_key": registration.lock_key, "backend_pid": registration.backend_pid},
            )
        return bool(seen)

    def _fall_back_to_leases(self, why: str) -> None:
        """Session locks do not work on this connection: deregister, so that peers wait for this
        process's leases, and say so once."""
        conn, registration = self._conn, self._registration
        if conn is not None and registration is not None:
            conn.execute(Q["presence_deregister"], {"instance": self._instance})
            # Behind a pooler the lock stays with a backend other clients use: give it back if this
            # statement reaches that backend (elsewhere it is a no-op).
            conn.execute(Q["presence_unlock"], {"lock_key": registration.lock_key})
        self._registration = None
        self._pooled = True
        log.warning(
            "workflow_presence_pooled",
            instance=self._instance,
            reason=why,
            consequence="session locks cannot be used (a transaction-mode pooler?): peers take this "
            "worker's nodes over only when their leases lapse",
        )

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        self._registration = None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):  # already broken: closing is all that is left
                conn.close()


def shared_worker_names(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Names under which more than one live worker process is registered, with how many."""
    return dict(fetch_all(conn, _named_processes, Q["shared_worker_names"]))


def _named_processes(*, worker_name: str, processes: int) -> tuple[str, int]:
    """A row of shared_worker_names."""
    return worker_name, processes

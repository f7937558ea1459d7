"""Database outages as a worker sees them: told apart from other errors, reported once, waited out.

A terminated connection, a restarting server or a full set of connection slots all surface as driver
errors that `eventstore.db.translate` turns into `DatabaseUnavailableError`. A worker reports each one to
its `Outage`, which logs `database_unavailable` once when an outage begins (a warning, no traceback) and
`database_available_again` with its duration when the database answers again; health endpoints read
its `snapshot()`. `wait_until_available` backs off (tenacity, exponential with jitter) until the
database answers or the worker stops (or, given a patience, until that long has passed).
`through_outages` does long work that resumes where it stopped (a bulk action, a retention pass): it
waits each outage out and starts the work again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import structlog
import tenacity

from eventstore.db import translate
from eventstore.errors import DatabaseUnavailableError
from eventstore.sqlfile import load_queries

log = structlog.get_logger(__name__)
Q = load_queries("eventstore", "outage.sql")

#: Back-off between attempts to reach the database: 50 ms, doubling, at most this many seconds.
MAX_BACKOFF = 2.0
#: ...and at most this many when it refused for want of a free connection slot (see `retry_delay`).
SLOTS_BACKOFF_MAX = 15.0
_PROBE_TIMEOUT = 2.0
#: How long every channel must answer before an outage is logged as over.
CONFIRM = 1.5


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` says the database cannot be reached (not that a statement was wrong)."""
    if isinstance(exc, DatabaseUnavailableError):
        return True
    if isinstance(exc, psycopg.Error):
        return isinstance(translate(exc), DatabaseUnavailableError)
    return isinstance(exc, psycopg_pool.PoolTimeout)


def as_unavailable(exc: BaseException) -> DatabaseUnavailableError:
    if isinstance(exc, DatabaseUnavailableError):
        return exc
    if isinstance(exc, psycopg.Error):
        translated = translate(exc)
        if isinstance(translated, DatabaseUnavailableError):
            return translated
    return DatabaseUnavailableError(str(exc))


@dataclass(frozen=True)
class OutageState:
    """What a worker last knew of its database, for health reports."""

    waiting: bool
    since: datetime | None = None
    seconds: float = 0.0
    error: str | None = None
    outages: int = 0


class Outage:
    """One reporter per worker: every part of it (main loop, keepalive, node threads) reports here, so an
    outage is logged once however many parts notice it. Thread-safe.

    Failures are kept per channel: "pool" (the worker's pooled connections) and "listener" (its LISTEN
    connection). With every connection slot taken, pooled connections may still work while the listener
    cannot reconnect: that is one outage until both work again, not one per attempt. Parts notice a
    restart at different moments (one may reconnect before another meets its broken connection), so
    the end is logged only once every channel has answered for `CONFIRM` seconds with no new failure;
    work resumes at once all the same.
    """

    def __init__(self, **context: Any) -> None:
        self._context = context
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._began: float | None = None
        self._began_at: datetime | None = None
        self._answered: float | None = None
        self._error: str | None = None
        self._count = 0

    def failed(self, exc: BaseException, channel: str = "pool") -> bool:
        """Note that the database did not answer; logs only when this starts an outage (and says so)."""
        error = str(as_unavailable(exc))
        with self._lock:
            self._error = error
            self._failing.add(channel)
            self._answered = None
            if self._began is not None:
                return False
            self._began, self._began_at = time.monotonic(), datetime.now(UTC)
            self._count += 1
        log.warning(
            "database_unavailable",
            error=error,
            noticed_by=channel,
            hint="waiting for PostgreSQL; work resumes by itself once it answers",
            **self._context,
        )
        return True

    @property
    def seconds(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        began = self._began
        return 0.0 if began is None else time.monotonic() - began

    def succeeded(self, channel: str = "pool") -> None:
        """Note that the database answered on `channel`."""
        with self._lock:
            self._failing.discard(channel)
            if not self._failing and self._began is not None and self._answered is None:
                self._answered = time.monotonic()
        self.settle()

    def settle(self, *, confirmed: bool = False) -> None:
        """Log the end of the outage once the database has answered for long enough (or at once, when
        the caller knows it is over: `confirmed`); cheap, and called often by the waker."""
        with self._lock:
            began, answered = self._began, self._answered
            if began is None or answered is None:
                return
            if not confirmed and time.monotonic() - answered < CONFIRM:
                return
            self._began = self._began_at = self._answered = None
        log.warning("database_available_again", outage_seconds=round(answered - began, 3), **self._context)

    def failing(self, channel: str = "pool") -> bool:
        return channel in self._failing

    @property
    def waiting(self) -> bool:
        return self._began is not None and self._answered is None

    def snapshot(self) -> OutageState:
        with self._lock:
            if self._began is None or self._answered is not None:
                return OutageState(waiting=False, error=None, outages=self._count)
            return OutageState(
                waiting=True,
                since=self._began_at,
                seconds=round(time.monotonic() - self._began, 3),
                error=self._error,
                outages=self._count,
            )


#: Messages of a server that refuses a connection for want of a free slot (libpq gives no SQLSTATE).
_SLOTS_FULL = (
    "too many clients already",
    "remaining connection slots are reserved",
    "too many connections for role",
    "too many connections for database",
)


def slots_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or an error it was raised from) says the server has no free connection slot."""
    while exc is not None:
        if any(words in str(exc) for words in _SLOTS_FULL):
            return True
        exc = exc.__cause__
    return False


#: The jitter's own generator: background threads that draw from the global `random` change its state
#: under code that seeds or watches it (hypothesis refuses to generate data when another thread does).
_JITTER = random.Random()


def retry_delay(attempt: int, exc: BaseException | None) -> float:
    """How long to wait before the `attempt`th (1, 2, ...) try to reach the database again after `exc`.

    A server that is away is tried again soon (50 ms, doubling up to `MAX_BACKOFF`, with a little
    jitter), so that work resumes quickly once it is back. A server that answers but has no free slot is
    full because other processes hold its connections: they are working, and a tight loop of attempts
    only costs the server a fork each. Such attempts back off further (`SLOTS_BACKOFF_MAX`) and with full
    jitter, so that the processes that wait spread out instead of retrying together."""
    step: float = 0.05 * 2.0 ** min(attempt - 1, 16)
    if slots_full(exc):
        return _JITTER.uniform(0.0, min(step * 10, SLOTS_BACKOFF_MAX))
    return min(step, MAX_BACKOFF) + _JITTER.uniform(0.0, 0.05)


class _Backoff(tenacity.wait.wait_base):
    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None and outcome.failed else None
        return retry_delay(retry_state.attempt_number, exc)


def backoff() -> tenacity.wait.wait_base:
    """The wait between attempts to reach the database again (see `retry_delay`)."""
    return _Backoff()


def sleeper(stopping: threading.Event) -> Callable[[float], None]:
    """A sleep for tenacity that ends early when `stopping` is set."""

    def sleep(seconds: float) -> None:
        stopping.wait(seconds)

    return sleep


def ping(pool: psycopg_pool.ConnectionPool[Any], timeout: float = _PROBE_TIMEOUT) -> None:
    """Raise DatabaseUnavailableError unless a pooled connection answers; drops broken idle connections
    first, so that work resuming after an outage does not meet them one by one."""
    try:
        pool.check()
        with pool.connection(timeout=timeout) as conn:
            conn.execute(Q["ping"]).fetchone()
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        raise as_unavailable(exc) from exc


def wait_until_available(
    pool: psycopg_pool.ConnectionPool[Any],
    outage: Outage,
    stopping: threading.Event,
    *,
    patience: float | None = None,
) -> bool:
    """Block until the database answers (True) or `stopping` is set, or `patience` seconds have passed
    since the outage began (False), backing off in between."""
    stop: tenacity.stop.stop_base = tenacity.stop_when_event_set(stopping)
    if patience is not None:
        stop = stop | tenacity.stop_after_delay(max(0.0, patience - outage.seconds))
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(DatabaseUnavailableError),
        wait=backoff(),
        stop=stop,
        sleep=sleeper(stopping),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                if stopping.is_set():
                    return False
                try:
                    ping(pool)
                except DatabaseUnavailableError as exc:
                    outage.failed(exc)
                    raise
    except DatabaseUnavailableError:
        return False
    outage.succeeded()
    return True


T = TypeVar("T")


def through_outages(
    work: Callable[[], T],
    pool: psycopg_pool.ConnectionPool[Any],
    outage: Outage,
    stopping: threading.Event,
    *,
    patience: float | None = None,
    waiting: Callable[[DatabaseUnavailableError], None] | None = None,
    resumed: Callable[[float], None] | None = None,
) -> T:
    """`work()`, called again each time it fails because the database is unavailable, once the database
    answers again: for work that resumes from what it recorded (a bulk action, a retention pass), so that
    a restart of the server costs its duration, not the work.

    Each outage is reported to `outage` (one warning, no traceback), and to `waiting` when it begins, to
    `resumed` (with its duration in seconds) once the work starts again. When `stopping` is set, or the
    database stays away `patience` seconds, the outage's DatabaseUnavailableError is raised."""
    told, failures = False, 0
    while True:
        try:
            result = work()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            if outage.failed(exc):
                failures = 0
                if waiting is not None:
                    waiting(as_unavailable(exc))
                    told = True
            failures += 1
            if not wait_until_available(pool, outage, stopping, patience=patience):
                raise
            if failures > 1:
                # The work failed again although the database answered (a server that turned read-only
                # answers a probe, not a write): back off rather than loop.
                stopping.wait(retry_delay(failures - 1, exc))
            if told and resumed is not None:
                resumed(outage.seconds)
            told = False
            continue
        outage.succeeded()
        outage.settle(confirmed=True)  # the work went on to its end: the outage is over
        return result

"""What the health endpoints ask the database. The only module of `ops.api` that runs SQL."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from eventstore import (
    EventStore,
    LedgerflowError,
    Migration,
    applied_versions,
    pending_migrations,
    shipped_migrations,
)
from eventstore.spi import Connection, OwnConnection, fetch_values, load_queries

log = structlog.get_logger(__name__)
Q = load_queries("ops.api")


@dataclass(frozen=True)
class MigrationStatus:
    applied: list[int]
    pending: list[Migration]


def ping(store: EventStore, timeout: float) -> None:
    """Raise DatabaseUnavailableError unless the database answers `SELECT 1` within about `timeout`."""
    with store.connection(timeout=timeout) as conn:
        conn.execute(Q["ping"]).fetchone()


@dataclass(frozen=True)
class Readiness:
    """What `/api/readyz` reports, as one read found it: migrations, and who is seen at work."""

    migrations: MigrationStatus
    #: Projections (of the server's) whose lease a projector holds.
    projection_owners: list[str]
    #: Workflow workers seen alive: holding a node lease, or sweeping for orphans lately.
    workers: list[str]


def read_readiness(conn: Connection, projections: Sequence[str], *, recent_seconds: float) -> Readiness:
    """Reads what `/api/readyz` reports on `conn`. With migrations pending, the tables the activity
    probes read may not exist yet: no activity is read then."""
    migrations = MigrationStatus(sorted(applied_versions(conn)), pending_migrations(conn))
    if migrations.pending:
        return Readiness(migrations, [], [])
    owners = fetch_values(conn, Q["live_projection_owners"], {"projections": list(projections)})
    workers = fetch_values(conn, Q["live_workflow_workers"], {"recent_seconds": recent_seconds})
    return Readiness(migrations, owners, workers)


def readiness(
    store: EventStore, projections: Sequence[str], *, recent_seconds: float, timeout: float
) -> Readiness:
    """`read_readiness` on a pool connection: for an app whose monitor has not checked yet."""
    with store.connection(timeout=timeout) as conn:
        return read_readiness(conn, projections, recent_seconds=recent_seconds)


class DatabaseMonitor:
    """Checks the database every `interval` seconds on a connection of its own, on a thread of its own,
    so that `/api/healthz` and `/api/readyz` answer from the last check at once: never behind busy
    requests for a thread or a pool connection (one tenant's requests may hold every one), never
    reporting a busy pool as a database that is away, and never costing a query per probe (an
    orchestrator probing often, or anyone, since they need no token). Each check pings, then reads what
    readyz reports (`read_readiness`, a few index probes); so readyz is at most about `interval` old."""

    def __init__(
        self,
        url: str,
        *,
        interval: float,
        timeout: float,
        projections: Sequence[str] = (),
        recent_seconds: float = 60.0,
    ) -> None:
        self._url, self._interval, self._timeout = url, interval, timeout
        self._projections, self._recent_seconds = list(projections), recent_seconds
        self._stopping = threading.Event()
        self._checked = threading.Event()
        self._last_ok: float | None = None
        self._error: str | None = None
        self._ready: Readiness | str | None = None
        self._thread: threading.Thread | None = None
        shipped_migrations()  # the migration files are read here, once, not at every check

    def start(self) -> None:
        """Starts checking; an app whose lifespan runs again (a test client per test) starts afresh."""
        self._stopping.clear()
        self._checked.clear()
        self._thread = threading.Thread(target=self._run, name="ledgerflow-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self._timeout + 1)

    def wait_checked(self, timeout: float) -> bool:
        """Whether a first check has ended (within `timeout` seconds)."""
        return self._checked.wait(timeout)

    def state(self) -> tuple[bool, str] | None:
        """(answers, why not) from the last check; None before the first. A check that has not ended
        within an interval and the probe timeout counts as the database not answering."""
        if not self._checked.is_set():
            return None
        if self._error is not None:
            return False, self._error
        age = time.monotonic() - (self._last_ok or 0.0)
        if age > self._interval + self._timeout:
            return False, f"the database has not answered for {age:.1f}s"
        return True, ""

    def readiness(self) -> Readiness | str | None:
        """What the last check read for readyz, or why it could not (the database not answering, or the
        read failing); None before the first check."""
        known = self.state()
        if known is None:
            return None
        answers, why = known
        return self._ready if answers else why

    def _read_readiness(self, own: OwnConnection) -> None:
        try:
            with own.use() as conn:
                self._ready = read_readiness(conn, self._projections, recent_seconds=self._recent_seconds)
        except LedgerflowError as exc:  # the database answers, but not this read: readyz says why
            if not isinstance(self._ready, str):
                log.warning("api_readiness_check_failed", error=str(exc))
            self._ready = str(exc)

    def _run(self) -> None:
        own = OwnConnection(
            self._url, name="ledgerflow-health", connect_timeout=max(1, math.ceil(self._timeout))
        )
        while not self._stopping.is_set():
            try:
                with own.use() as conn:
                    conn.execute(Q["ping"]).fetchone()
                self._read_readiness(own)
                self._last_ok, self._error = time.monotonic(), None
            except LedgerflowError as exc:
                if self._error is None:
                    log.warning("api_health_check_failed", error=str(exc))
                self._error = str(exc)
                own.close()
            self._checked.set()
            self._stopping.wait(self._interval)
        own.close()

"""The running pieces a ledgerflow process shares between its roles (API, console, workers)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

import structlog
import tenacity

from eventstore import DatabaseRefusedError, EventStore, MisconfiguredDatabaseError, open_store, redact
from eventstore.spi import Outage, backoff, check_database_url, is_unavailable, sleeper
from ops.cli.errors import explain_connect_failure
from ops.settings import Settings
from projector import Projection, load_projections
from workflows import Engine, Quota, TenantQuotas, WorkflowRegistry, load_workflows, workflow_tables

if TYPE_CHECKING:
    from ops.roles import Role

log = structlog.get_logger(__name__)

#: How long one start-up attempt waits for a first connection before backing off and trying again.
_STARTUP_ATTEMPT_TIMEOUT = 2.0


@dataclass
class Services:
    settings: Settings
    store: EventStore
    registry: WorkflowRegistry
    projections: list[Projection] = field(default_factory=list)
    #: The worker roles this process runs (`ledgerflow serve`), for health reports.
    roles: list[Role] = field(default_factory=list)
    #: The per-tenant quotas (their rate buckets live in the database, shared by every process).
    quotas: TenantQuotas = field(init=False)
    #: The engine every request and command of the process goes through. One is built: its caps and tag
    #: limits are settings read from the environment at construction, and the rest of its state (store,
    #: registry, quotas) is shared and thread-safe already, so request threads share it.
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        self.quotas = tenant_quotas(self.settings, self.store)
        self.engine = Engine(self.store, self.registry, quotas=self.quotas)

    def close(self) -> None:
        self.store.close()


def tenant_quotas(settings: Settings, store: EventStore) -> TenantQuotas:
    """The per-tenant quotas the settings define (unbounded by default)."""
    return TenantQuotas(
        store,
        Quota(
            settings.tenant_max_runs_in_flight,
            settings.tenant_starts_per_second,
            settings.tenant_appends_per_second,
        ),
        burst=settings.tenant_rate_burst,
        refresh=settings.tenant_quotas_refresh,
    )


def open_store_when_available(
    settings: Settings, *, name: str, stopping: threading.Event | None = None
) -> EventStore:
    """`open_store` (migrations applied), waiting for as long as the database is unavailable: down,
    restarting, or without a free connection slot. Says so once (`database_unavailable`), backs off,
    and says when it answers again. A permanent misconfiguration (a malformed URL, no such database, a
    refused login) raises MisconfiguredDatabaseError at once, as does any error other than an unavailable
    database."""
    # Outages are reported by ledgerflow, once; the driver's own lines (one per failed connection
    # attempt, per broken connection cleaned up) would bury that report.
    for driver in ("psycopg", "psycopg.pool"):
        logging.getLogger(driver).setLevel(logging.ERROR)
    outage = Outage(role=name, stage="startup")
    attempt_settings = settings.model_copy(
        update={"connect_timeout": min(settings.connect_timeout, _STARTUP_ATTEMPT_TIMEOUT)}
    )
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_unavailable),
        wait=backoff(),
        stop=tenacity.stop_when_event_set(stopping or threading.Event()),
        sleep=sleeper(stopping or threading.Event()),
        reraise=True,
    )
    check_database_url(settings.database_url)
    for attempt in retrying:
        with attempt:
            try:
                store = open_store(attempt_settings, name=name)
            except DatabaseRefusedError as exc:
                # A mistake, not an outage: say so at once rather than wait for ever.
                what, todo = explain_connect_failure(exc, settings.database_url)
                raise MisconfiguredDatabaseError(what, todo) from exc
            except Exception as exc:
                if is_unavailable(exc):
                    outage.failed(exc)
                raise
    log.info("event_store_opened", database=redact(store.url), pool_max=settings.pool_max_size)
    outage.succeeded()
    outage.settle(confirmed=True)  # the store is open: this start-up's wait is over
    return store


class StopSignal:
    """SIGTERM and SIGINT, noted from the start of the process: a process still waiting for the
    database to open its store stops too, instead of dying by the signal's default action."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._then: list[Callable[[], None]] = []

    @classmethod
    def install(cls) -> StopSignal:
        stop = cls()
        signal.signal(signal.SIGTERM, stop._received)
        signal.signal(signal.SIGINT, stop._received)
        return stop

    def then(self, fn: Callable[[], None]) -> None:
        """Call `fn` on the signal (at once if it came already)."""
        self._then.append(fn)
        if self.event.is_set():
            fn()

    def _received(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()  # only events are set here: a signal handler must not take locks
        for fn in list(self._then):
            fn()


def open_until_stopped(settings: Settings, name: str, stopping: StopSignal) -> EventStore | None:
    """`open_store_when_available`, or None when the process is stopped while it waits."""
    try:
        return open_store_when_available(settings, name=name, stopping=stopping.event)
    except Exception as exc:
        if stopping.event.is_set() and is_unavailable(exc):
            log.info("stopped_before_start", role=name)
            return None
        raise


def open_services(
    settings: Settings, *, name: str = "ledgerflow", stopping: threading.Event | None = None
) -> Services:
    """Open the store (embedded PostgreSQL unless a URL is set; migrations applied; waiting while the
    database is unavailable), load the configured workflows and projections. The workflow tables
    projection is always included."""
    store = open_store_when_available(settings, name=name, stopping=stopping)
    return Services(settings, store, load_workflows(settings.workflow_paths), all_projections(settings))


def all_projections(settings: Settings) -> list[Projection]:
    """The built-in projections (the workflow tables among them) and the configured ones: what every
    projector runs and every operator command knows."""
    projections = load_projections(settings.projection_paths)
    if all(p.name != workflow_tables.name for p in projections):
        projections.append(workflow_tables)
    return projections

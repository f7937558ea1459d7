"""Per-tenant quotas: runs in flight, starts per second and appends per second.

    quotas = TenantQuotas(store, Quota(max_runs_in_flight=100, starts_per_second=20))
    engine = Engine(store, registry, quotas=quotas)

The defaults come from settings (`LEDGERFLOW_TENANT_*`); a row of `ledgerflow.tenant_quotas` overrides
them for one tenant (`set_tenant_quota`). Each process reads that table as a whole at most every
`refresh` seconds, so a change takes effect within that time.

- **Runs in flight** hold across every process sharing the database: a start of a tenant with this quota
  counts the tenant's runs in the queue, under a lock of that tenant only, in the transaction that starts
  the run (ledgerflow.wf_runs_in_flight). A run is in flight from its start until it ends (succeeded,
  failed or cancelled); a waiting or parked run is in flight.
- **A continue_as_new successor** is never refused, by either quota: it replaces its run, which was
  admitted (so the runs in flight do not change), and it counts against the starts per second
  (`charge_start`, in the continuation's transaction), the bucket going into debt if need be.
- **Starts and appends per second** hold across every process too: one token bucket per tenant and quota
  in the database (`ledgerflow.tenant_rate_buckets`), refilled from the database's clock and taken from
  in one statement on the caller's pinned connection (ledgerflow.take_rate_tokens; one round trip, a lock
  of that tenant's bucket row only for that statement). A bucket holds `burst` seconds' worth of tokens
  (at least one), so a quiet tenant may send a short burst at once. A take asks for up to `SPARE_SECONDS`
  of the rate's tokens at once (at most `SPARE_MAX`; one at rates under 20 a second), and the process
  spends the rest on the tenant's next requests within that time: at high rates most requests cost no
  round trip, and the processes together never spend more tokens than the bucket gave.

A refusal raises `QuotaExceededError` (HTTP 429 with `Retry-After`) before anything is written. Tenants
without any quota pay nothing: no lock, no count, no bucket.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from psycopg.rows import class_row

from eventstore import EventStore, InvalidInputError, QuotaExceededError
from eventstore.spi import check_tenant, fetch_one, fetch_value, load_queries
from workflows.errors import wrap_exceptions

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "quotas.sql")
#: What a refused start under the runs-in-flight quota is told to wait: how long a run takes is unknown.
IN_FLIGHT_RETRY_AFTER = 1.0
#: The SQLSTATE of ledgerflow.wf_admit_run's refusal (migrations/0032_tenant_quotas.sql).
IN_FLIGHT_REFUSED = "LFQ01"
#: A take of rate tokens asks for this many seconds' worth of the rate (see the module's docstring)...
SPARE_SECONDS = 0.05
#: ...at most this many tokens...
SPARE_MAX = 100
#: ...and the tokens a process holds spare are spent within this time, or dropped.
SPARE_LIFETIME = 0.5
#: Where each quota's default comes from, for the messages that name it.
SETTINGS = {
    "max_runs_in_flight": "LEDGERFLOW_TENANT_MAX_RUNS_IN_FLIGHT",
    "starts_per_second": "LEDGERFLOW_TENANT_STARTS_PER_SECOND",
    "appends_per_second": "LEDGERFLOW_TENANT_APPENDS_PER_SECOND",
}


@dataclass(frozen=True)
class Quota:
    """A tenant's bounds; None: unbounded."""

    max_runs_in_flight: int | None = None
    starts_per_second: float | None = None
    appends_per_second: float | None = None

    def __post_init__(self) -> None:
        if self.max_runs_in_flight is not None and self.max_runs_in_flight < 1:
            raise InvalidInputError("max_runs_in_flight must be at least 1 (or None: unbounded)")
        for name in ("starts_per_second", "appends_per_second"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise InvalidInputError(f"{name} must be a positive number (or None: unbounded)")


@dataclass(frozen=True, slots=True)
class _Taken:
    """A row of take_rate_tokens: the tokens granted, and the seconds until the next one when none was."""

    granted: int
    retry_after: float


@dataclass(frozen=True)
class _TenantRow:
    tenant: str
    max_runs_in_flight: int | None
    starts_per_second: float | None
    appends_per_second: float | None


class TenantQuotas:
    """The quotas of every tenant, as one process enforces them (see the module's docstring)."""

    def __init__(
        self,
        store: EventStore,
        defaults: Quota = Quota(),
        *,
        burst: float = 1.0,
        refresh: float = 5.0,
        clock: Callable[[], float] | None = None,
        spare_seconds: float = SPARE_SECONDS,
    ) -> None:
        """`clock`: seconds, for tests that move time by hand (the rows' refresh, and the buckets' refill
        as a Unix time); None: the buckets refill from the database's clock, shared by every process.
        `spare_seconds`: how much of a rate one take asks for (0: one token, a statement per request)."""
        self.store = store
        self.defaults = defaults
        self.burst = burst
        self.refresh = refresh
        self.clock = clock or time.monotonic
        self._bucket_clock = clock
        self.spare_seconds = spare_seconds
        self._lock = threading.Lock()
        self._rows: dict[str, _TenantRow] = {}
        self._read_at: float | None = None
        #: Tokens taken from the database's buckets and not yet spent: count and monotonic expiry.
        self._spare: dict[tuple[str, str], tuple[int, float]] = {}

    # -- what applies -------------------------------------------------------------------------------

    def quota(self, tenant: str) -> Quota:
        """`tenant`'s quotas now: its row's, where set, else the defaults."""
        row = self._tenant_rows().get(tenant)
        if row is None:
            return self.defaults
        d = self.defaults
        return Quota(
            row.max_runs_in_flight if row.max_runs_in_flight is not None else d.max_runs_in_flight,
            row.starts_per_second if row.starts_per_second is not None else d.starts_per_second,
            row.appends_per_second if row.appends_per_second is not None else d.appends_per_second,
        )

    def _source(self, tenant: str, quota: str) -> str:
        row = self._rows.get(tenant)
        if row is not None and getattr(row, quota) is not None:
            return "the tenant's own, in ledgerflow.tenant_quotas; see `ledgerflow quotas list`"
        return f"setting {SETTINGS[quota]}"

    def _tenant_rows(self) -> dict[str, _TenantRow]:
        now = self.clock()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.refresh:
                return self._rows
        rows = {
            tenant: _TenantRow(tenant, q.max_runs_in_flight, q.starts_per_second, q.appends_per_second)
            for tenant, q in tenant_quota_rows(self.store).items()
        }
        with self._lock:
            self._rows, self._read_at = rows, now
            return rows

    # -- admission ----------------------------------------------------------------------------------

    def take_start(self, tenant: str) -> None:
        """Admit a start of `tenant` under its starts-per-second quota, or raise QuotaExceededError."""
        self._take(tenant, "starts_per_second", self.quota(tenant).starts_per_second)

    def take_append(self, tenant: str) -> None:
        """Admit an append of `tenant` under its appends-per-second quota, or raise QuotaExceededError."""
        self._take(tenant, "appends_per_second", self.quota(tenant).appends_per_second)

    def _take(self, tenant: str, quota: str, rate: float | None) -> None:
        if rate is None:
            return
        if self._spend_spare(tenant, quota):
            return
        at = None if self._bucket_clock is None else datetime.fromtimestamp(self._bucket_clock(), UTC)
        capacity = max(1.0, rate * self.burst)
        want = max(1, min(SPARE_MAX, int(rate * self.spare_seconds), int(capacity)))
        params = {"tenant": tenant, "quota": quota, "rate": rate, "capacity": capacity, "want": want}
        # The caller's pinned connection (an append's, a start's): no second connection, no lost pin.
        with wrap_exceptions(), self.store.statement_connection() as conn:
            taken = fetch_one(conn, _Taken, Q["take_rate_tokens"], {**params, "at": at})
        assert taken is not None  # the function always answers one row
        granted, wait = taken.granted, taken.retry_after
        if granted < 1:
            raise self._refusal(tenant, quota, rate, wait)
        if granted > 1:
            with self._lock:
                self._spare[tenant, quota] = (granted - 1, time.monotonic() + SPARE_LIFETIME)

    def charge_start(self, conn: psycopg.Connection[Any], tenant: str) -> None:
        """Count a start of `tenant` that must not be refused (a continue_as_new successor) against its
        starts-per-second quota, in the caller's transaction `conn`: counted if and only if that transaction
        commits. The token is taken from the database's bucket whatever it holds, which may leave it in
        debt, so the tenant's next starts wait until the rate has paid it back."""
        rate = self.quota(tenant).starts_per_second
        if rate is None:
            return
        at = None if self._bucket_clock is None else datetime.fromtimestamp(self._bucket_clock(), UTC)
        params = {
            "tenant": tenant,
            "quota": "starts_per_second",
            "rate": rate,
            "capacity": max(1.0, rate * self.burst),
            "at": at,
        }
        tokens = fetch_value(conn, Q["charge_rate_token"], params)
        if tokens < 0:
            log.info("tenant_quota_in_debt", tenant=tenant, quota="starts_per_second", tokens=float(tokens))

    def _spend_spare(self, tenant: str, quota: str) -> bool:
        """Spend one of the tokens this process took earlier, if it holds one that is fresh enough."""
        with self._lock:
            count, expires = self._spare.get((tenant, quota), (0, 0.0))
            if count < 1 or time.monotonic() > expires:
                self._spare.pop((tenant, quota), None)
                return False
            self._spare[tenant, quota] = (count - 1, expires)
            return True

    def max_runs_in_flight(self, tenant: str) -> int | None:
        return self.quota(tenant).max_runs_in_flight

    def admit_run(self, conn: psycopg.Connection[Any], tenant: str, limit: int) -> None:
        """In the transaction that starts a run of `tenant`, before it writes: admit the run under the
        tenant's quota of `limit` runs in flight. A refusal is an error of the statement (the transaction
        then rolls back), which `refusal()` turns into QuotaExceededError wherever it surfaces: sent in a
        pipeline, the statement costs no round trip of its own. Holds the tenant's admission lock until
        that transaction ends."""
        conn.execute(Q["admit_run"], {"tenant": tenant, "at_most": limit})

    @contextmanager
    def refusal(self, tenant: str, limit: int) -> Iterator[None]:
        """Around a start that `admit_run` admits: its refusal becomes QuotaExceededError, also when it
        surfaced inside another boundary that translated it (its `__cause__` is the driver's error)."""
        try:
            yield
        except Exception as exc:
            cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
            if isinstance(cause, psycopg.Error) and cause.sqlstate == IN_FLIGHT_REFUSED:
                raise self._refusal(tenant, "max_runs_in_flight", limit, IN_FLIGHT_RETRY_AFTER) from None
            raise

    def _refusal(self, tenant: str, quota: str, limit: float, retry_after: float) -> QuotaExceededError:
        log.info("tenant_quota_exceeded", tenant=tenant, quota=quota, limit=limit, retry_after=retry_after)
        return QuotaExceededError(tenant, quota, limit, retry_after, self._source(tenant, quota))


def set_tenant_quota(store: EventStore, tenant: str, quota: Quota) -> None:
    """Give `tenant` quotas of its own (None in a field: the setting applies), in every process within
    its refresh interval."""
    check_tenant(tenant)
    with wrap_exceptions(), store.pool.connection() as conn:
        conn.execute(
            Q["set_tenant_quota"],
            {
                "tenant": tenant,
                "max_runs_in_flight": quota.max_runs_in_flight,
                "starts_per_second": quota.starts_per_second,
                "appends_per_second": quota.appends_per_second,
            },
        )
    log.info("tenant_quota_set", tenant=tenant, **quota.__dict__)


def tenant_quota_rows(store: EventStore) -> dict[str, Quota]:
    """The tenants with quotas of their own, as their rows say (None: the setting applies)."""
    with (
        wrap_exceptions(),
        store.pool.connection() as conn,
        conn.cursor(row_factory=class_row(_TenantRow)) as cur,
    ):
        rows = cur.execute(Q["tenant_quotas"]).fetchall()
    return {r.tenant: Quota(r.max_runs_in_flight, r.starts_per_second, r.appends_per_second) for r in rows}


def clear_tenant_quota(store: EventStore, tenant: str) -> None:
    """`tenant` goes back to the settings' quotas."""
    check_tenant(tenant)
    with wrap_exceptions(), store.pool.connection() as conn:
        conn.execute(Q["clear_tenant_quota"], {"tenant": tenant})
    log.info("tenant_quota_cleared", tenant=tenant)

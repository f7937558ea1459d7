"""Debounced starts: a burst of starts with the same key starts one run, with the latest input, once
`window` seconds have passed since the burst's last start (trailing edge, as DBOS and Inngest do).

    engine.start("reindex", input={"doc": 7}, debounce=Debounce(key="doc-7", window=5))

The burst is a row of `ledgerflow.workflow_debounces`, written by each start (see the `debounce` query):
nothing of it lives in a process, so a starter or a worker killed mid-burst neither loses the run nor
starts it twice. Every start of the burst answers at once with the id the run will have; the run exists
once a worker fires the burst (`DebounceKeeper`, a thread of every workflow worker, looks at least every
`_LONGEST_WAIT` seconds, so a run starts up to that much after its due time). With `max_wait`, a burst
that never pauses still starts its run that long after its first start. The next start after the run
began opens a new burst.
"""

from __future__ import annotations

import math
import threading
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from psycopg.rows import class_row

from eventstore import EventStore, InvalidInputError, QuotaExceededError
from eventstore.spi import (
    Outage,
    fetch_one,
    fetch_value,
    is_unavailable,
    json_dumps,
    json_loads,
    load_queries,
    wait_until_available,
)
from workflows.errors import wrap_exceptions
from workflows.quotas import TenantQuotas

if TYPE_CHECKING:
    from workflows.engine import Engine

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "debounce.sql")
#: A worker looks for due bursts at least this often (seconds): the most a run starts after it is due.
_LONGEST_WAIT = 0.5
#: How long a worker waits when every due burst is locked by another worker firing it.
_LOCKED_WAIT = 0.05
#: A burst whose run failed to start (other than for a quota) is tried again this much later.
_FAILED_WAIT = 30.0
#: The longest window or max_wait (seconds): one day.
MAX_WINDOW = 86_400.0
_MAX_KEY = 200


@dataclass(frozen=True)
class Debounce:
    """Start one run per burst of starts with `key` (per tenant and workflow): `window` seconds after the
    burst's last start, or `max_wait` seconds after its first, whichever comes first."""

    key: str
    window: float
    max_wait: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not 0 < len(self.key) <= _MAX_KEY or not self.key.isprintable():
            raise InvalidInputError(f"debounce key must be 1-{_MAX_KEY} printable characters")
        for name in ("window", "max_wait"):
            value = getattr(self, name)
            if value is None and name == "max_wait":
                continue
            if (
                not isinstance(value, int | float)
                or not (0 < value <= MAX_WINDOW)
                or not math.isfinite(value)
            ):
                raise InvalidInputError(f"debounce {name} must be a number of seconds in (0, {MAX_WINDOW:g}]")


@dataclass(frozen=True)
class Burst:
    """A start's place in its burst."""

    #: Names the burst's run: its idempotency key is `idempotency_key(burst)`.
    burst: uuid.UUID
    #: Starts of the burst so far, this one included.
    starts: int
    #: When the run starts at the earliest, as of this start.
    due_at: datetime


def idempotency_key(burst: uuid.UUID) -> str:
    return f"debounce:{burst}"


@dataclass(frozen=True)
class _DueRow:
    tenant: str
    workflow: str
    key: str
    burst: uuid.UUID
    input: str
    starts: int


@dataclass(frozen=True)
class PendingBurst:
    tenant: str
    workflow: str
    key: str
    burst: uuid.UUID
    starts: int
    first_at: datetime
    due_at: datetime


def record_start(store: EventStore, tenant: str, workflow: str, input: Any, debounce: Debounce) -> Burst:
    """Record one start of `debounce.key`'s burst (the first opens it)."""
    params = {
        "tenant": tenant,
        "workflow": workflow,
        "key": debounce.key,
        "burst": uuid.uuid4(),
        "input": json_dumps(input),
        "window": float(debounce.window),
        "max_wait": None if debounce.max_wait is None else float(debounce.max_wait),
    }
    with wrap_exceptions(), store.pool.connection() as conn:
        burst = fetch_one(conn, Burst, Q["debounce"], params)
    assert burst is not None  # the upsert answers its row
    return burst


def pending(store: EventStore) -> list[PendingBurst]:
    with (
        wrap_exceptions(),
        store.pool.connection() as conn,
        conn.cursor(row_factory=class_row(PendingBurst)) as cur,
    ):
        return cur.execute(Q["pending"]).fetchall()


def fire_due(engine: Engine, workflows: list[str], quotas: TenantQuotas | None = None) -> int:
    """Start the runs of due bursts of `workflows` (those no other worker is firing), one transaction per
    burst: its run started and its row deleted together. Returns how many were fired. With `quotas`, a
    run over its tenant's runs in flight is not started: its burst is looked at again later. (Its start
    was counted against the tenant's starts per second when it was asked for.)"""
    fired = 0
    while True:
        with wrap_exceptions(), engine.store.pool.connection() as conn, conn.transaction():
            with conn.cursor(row_factory=class_row(_DueRow)) as cur:
                row = cur.execute(Q["take_due"], {"workflows": workflows}).fetchone()
            if row is None:
                break
            where = {"tenant": row.tenant, "workflow": row.workflow, "key": row.key, "burst": row.burst}
            limit = quotas.max_runs_in_flight(row.tenant) if quotas is not None else None
            try:
                with (
                    quotas.refusal(row.tenant, limit) if quotas and limit else nullcontext(),
                    conn.transaction(),  # a savepoint: a refusal leaves the row to postpone
                ):
                    if quotas is not None and limit is not None:
                        quotas.admit_run(conn, row.tenant, limit)
                    started = engine.start(
                        row.workflow,
                        input=json_loads(row.input),
                        idempotency_key=idempotency_key(row.burst),
                        tenant=row.tenant,
                        conn=conn,  # the run commits with the row's deletion, or neither does
                    )
            except QuotaExceededError as exc:
                conn.execute(Q["postpone"], {**where, "delay": exc.retry_after})
                log.info("debounce_postponed", **_fields(row), retry_after=exc.retry_after)
                continue
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                # One burst that cannot start must not hold up the others behind it.
                conn.execute(Q["postpone"], {**where, "delay": _FAILED_WAIT})
                log.exception("debounce_fire_failed", **_fields(row), retry_in=_FAILED_WAIT)
                continue
            conn.execute(Q["fired"], where)
        engine.store.notify_appended()  # workers claim the run's first nodes now, not at their next poll
        fired += 1
        log.info("debounce_fired", **_fields(row), run_id=str(started.run_id), created=started.created)
    return fired


def _fields(row: _DueRow) -> dict[str, Any]:
    return {"tenant": row.tenant, "workflow": row.workflow, "key": row.key, "starts": row.starts}


def seconds_to_next_due(engine: Engine, workflows: list[str]) -> float:
    with wrap_exceptions(), engine.store.pool.connection() as conn:
        seconds = fetch_value(conn, Q["next_due"], {"workflows": workflows})
    if seconds is None:
        return _LONGEST_WAIT
    return min(_LONGEST_WAIT, max(0.0, float(seconds)))


class DebounceKeeper:
    """Fires due bursts of a registry's workflows, in a thread of the workflow worker, until stopped."""

    def __init__(
        self,
        engine: Engine,
        workflows: list[str],
        *,
        worker_id: str,
        quotas: TenantQuotas | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.engine = engine
        self.quotas = quotas
        self.workflows = workflows
        self.worker_id = worker_id
        #: The worker's own, shared: an outage is the process's, reported once whoever meets it first.
        self.outage = outage or Outage(worker=worker_id, role="debounces")
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.workflows and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledgerflow-debounces", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        structlog.contextvars.bind_contextvars(worker=self.worker_id)  # this thread's log lines
        while not self.stopping.is_set():
            try:
                # One query while nothing is due: the soonest due time (and how long to sleep).
                wait = seconds_to_next_due(self.engine, self.workflows)
                if wait <= 0:
                    if fire_due(self.engine, self.workflows, self.quotas):
                        continue
                    wait = _LOCKED_WAIT  # the due bursts are another worker's to fire at this moment
            except Exception as exc:
                if not is_unavailable(exc):
                    log.exception("debounce_check_failed")
                    wait = _LONGEST_WAIT
                else:
                    self.outage.failed(exc)
                    if not wait_until_available(self.engine.store.pool, self.outage, self.stopping):
                        break
                    continue
            self.stopping.wait(wait + 0.005)  # just past the due time, so that the burst is due

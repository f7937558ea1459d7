"""Schedules: a workflow declared with `schedule=Schedule(cron=...)` gets one run per tick, across any
number of workers.

Each scheduled workflow has a row in `ledgerflow.workflow_schedules` with the last tick whose run was
started. Every worker looks at its schedules when their next tick is due (and every few seconds); one
takes the row's lock with SELECT ... FOR UPDATE SKIP LOCKED, starts the due ticks' runs and moves
`last_tick` in that transaction, while the others skip the row: a worker killed at any moment leaves the
runs and the new `last_tick`, or neither. Each tick's run also carries the idempotency key
`schedule:<workflow>:<tick>`, a second guard: a start repeated for a tick returns the run already made.

Ticks that passed while no worker ran follow the schedule's `catch_up`: "skip" starts a run for the
latest of them only, "all" one for each of them, at most `max_catch_up` (the latest ones). Cron
expressions are read by croniter, in UTC; a sixth field counts seconds.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from croniter import croniter
from opentelemetry import metrics
from psycopg.rows import class_row

from eventstore import EventStore
from eventstore.spi import Outage, fetch_value, is_unavailable, load_queries, wait_until_available
from workflows.definition import Workflow
from workflows.engine import Engine
from workflows.run_sources import Schedule
from workflows.run_starts import Started
from workflows.workflow_registry import WorkflowRegistry

log = structlog.get_logger(__name__)
_meter = metrics.get_meter("ledgerflow.workflows")
_ticks = _meter.create_counter(
    "ledgerflow.workflow.schedule_ticks",
    description="Schedule ticks, by workflow and outcome: started, or skipped under the catch-up policy",
)
_tick_lateness = _meter.create_histogram(
    "ledgerflow.workflow.schedule_lateness", unit="ms", description="From a tick to the start of its run"
)
Q = load_queries("workflows", "schedules.sql")
Clock = Callable[[], datetime]
#: A worker looks at its schedules at least this often, also when no tick is due (a peer may have died
#: holding a row, or the clock may have jumped).
_LONGEST_WAIT = 5.0
#: How far back a "skip" schedule counts the ticks it skips, for the log and the table.
_COUNT_SKIPPED = 1000


@dataclass(frozen=True)
class ScheduleRow:
    tenant: str
    workflow: str
    cron: str
    catch_up: str
    last_tick: datetime
    last_run_id: uuid.UUID | None
    ticks_started: int
    ticks_skipped: int
    updated_at: datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def latest_tick(cron: str, at: datetime) -> datetime:
    """The latest tick of `cron` at or before `at` (croniter's steps back are strict: hence the
    microsecond)."""
    return croniter(cron, at + timedelta(microseconds=1)).get_prev(datetime)


def next_tick(cron: str, after: datetime) -> datetime:
    """The first tick of `cron` strictly after `after`, counted in UTC as every tick is (a time read from
    a session in another time zone names the same instant, not the same wall clock)."""
    return croniter(cron, after.astimezone(UTC)).get_next(datetime)


def due_ticks(schedule: Schedule, last_tick: datetime, now: datetime) -> tuple[list[datetime], int]:
    """The ticks after `last_tick`, up to `now`, to start runs for (oldest first) under the schedule's
    catch-up policy, and how many due ticks it leaves without a run (counted up to a bound)."""
    limit = 1 if schedule.catch_up == "skip" else schedule.max_catch_up
    # Walked backwards from now: a long downtime costs `limit` steps, not one per missed tick.
    tick = latest_tick(schedule.cron, now)
    earlier = croniter(schedule.cron, tick)
    ticks: list[datetime] = []
    skipped = 0
    while tick > last_tick and skipped < _COUNT_SKIPPED:
        if len(ticks) < limit:
            ticks.append(tick)
        else:
            skipped += 1
        tick = earlier.get_prev(datetime)
    return ticks[::-1], skipped


def idempotency_key(workflow: str, tick: datetime) -> str:
    return f"schedule:{workflow}:{tick.astimezone(UTC).isoformat()}"


def schedule_input(tick: datetime) -> dict[str, Any]:
    return {"tick": tick.astimezone(UTC).isoformat()}


def run_due_ticks(engine: Engine, wf: Workflow, now: datetime) -> list[Started]:
    """Start the runs of `wf`'s due ticks, if no other worker is doing it at this moment; the runs
    started (or found started by the idempotency key)."""
    schedule = wf.schedule
    assert schedule is not None
    params: dict[str, Any] = {
        "tenant": schedule.tenant,
        "workflow": wf.name,
        "cron": schedule.cron,
        "catch_up": schedule.catch_up,
    }
    with engine.store.pool.connection() as conn:
        conn.execute(Q["ensure_schedule"], {**params, "last_tick": latest_tick(schedule.cron, now)})
        conn.commit()
        with conn.transaction():
            last_tick = fetch_value(conn, Q["lock_schedule"], params)
            if last_tick is None:
                return []  # another worker holds the row: it starts these ticks
            ticks, skipped = due_ticks(schedule, last_tick, now)
            if not ticks:
                return []
            started = [
                engine.start(
                    wf.name,
                    input=schedule_input(tick),
                    idempotency_key=idempotency_key(wf.name, tick),
                    tenant=schedule.tenant,
                    conn=conn,  # the runs commit with the schedule's new last tick, or neither does
                )
                for tick in ticks
            ]
            conn.execute(
                Q["advance_schedule"],
                {
                    **params,
                    "last_tick": ticks[-1],
                    "run_id": started[-1].run_id,
                    "started": sum(s.created for s in started),
                    "skipped": skipped,
                },
            )
    engine.store.notify_appended()  # workers claim the new runs' nodes now, not at their next poll
    late_ms = (now - ticks[-1]).total_seconds() * 1000  # when this worker looked
    _tick_lateness.record(max(0.0, late_ms), {"workflow": wf.name})
    _ticks.add(sum(s.created for s in started), {"workflow": wf.name, "outcome": "started"})
    _ticks.add(skipped, {"workflow": wf.name, "outcome": "skipped"})
    for tick, s in zip(ticks, started, strict=True):
        log.info(
            "workflow_scheduled",
            workflow=wf.name,
            tick=tick.isoformat(),
            run_id=str(s.run_id),
            created=s.created,
            tenant=schedule.tenant,
        )
    if skipped:
        log.warning("schedule_ticks_skipped", workflow=wf.name, skipped=skipped, catch_up=schedule.catch_up)
    return started


def list_schedules(store: EventStore) -> list[ScheduleRow]:
    with store.connection() as conn, conn.cursor(row_factory=class_row(ScheduleRow)) as cur:
        return cur.execute(Q["list_schedules"]).fetchall()


class ScheduleKeeper:
    """Starts the runs of a registry's schedules, in a thread of the workflow worker, until stopped."""

    def __init__(
        self,
        engine: Engine,
        registry: WorkflowRegistry,
        *,
        worker_id: str,
        clock: Clock = utc_now,
        outage: Outage | None = None,
    ) -> None:
        self.engine = engine
        self.workflows = [w for w in (registry.get(n) for n in registry.names()) if w.schedule]
        self.clock = clock
        self.worker_id = worker_id
        self.outage = outage or Outage(worker=worker_id, role="schedules")
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.workflows and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledgerflow-schedules", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def check(self) -> None:
        """Start every due tick's run now (those no other worker is starting)."""
        for wf in self.workflows:
            if self.stopping.is_set():
                return
            try:
                run_due_ticks(self.engine, wf, self.clock())
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                log.exception("schedule_failed", workflow=wf.name)

    def _seconds_to_next_tick(self) -> float:
        now = self.clock()
        soonest = min(next_tick(w.schedule.cron, now) for w in self.workflows if w.schedule)
        return min(_LONGEST_WAIT, max(0.0, (soonest - now).total_seconds()))

    def _run(self) -> None:
        structlog.contextvars.bind_contextvars(worker=self.worker_id)  # this thread's log lines
        log.info("schedules_started", workflows=[w.name for w in self.workflows])
        while not self.stopping.is_set():
            try:
                self.check()
            except Exception as exc:
                if not is_unavailable(exc):
                    log.exception("schedules_check_failed")
                else:
                    self.outage.failed(exc)
                    if not wait_until_available(self.engine.store.pool, self.outage, self.stopping):
                        break
                    continue
            # Just past the next tick, so that it is due when the worker looks.
            self.stopping.wait(self._seconds_to_next_tick() + 0.005)

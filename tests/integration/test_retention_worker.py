"""Retention as a role (`workflows.retention_worker.RetentionWorker`, `ledgerflow serve`'s `retention`
role): a tick passes over every tenant, pass after pass while passes fill their batches (though the run
tables still show what the last one released), one process at a time, and never releases a run twice."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from eventstore import EventStore
from tests.run_tables import project_runs
from tests.waiting import joined, wait_until
from workflows import (
    Engine,
    NodeContext,
    RetentionSettings,
    RetentionWorker,
    Workflow,
    WorkflowRegistry,
)
from workflows import events as ev
from workflows.retention_worker import _sole_pass

registry = WorkflowRegistry()
hold = Workflow("hold")


@hold.node()
def held(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("go")


registry.register(hold)

#: Every ended run is due; a pass takes 3 runs per workflow and tenant.
DUE = {"run_retention": timedelta(microseconds=1), "retention_batch": 3}


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def ended_runs(engine: Engine, count: int, tenant: str = "default") -> list[uuid.UUID]:
    runs = [engine.start("hold", tenant=tenant).run_id for _ in range(count)]
    for run_id in runs:
        engine.cancel(run_id, tenant=tenant)  # nothing in flight: cancelled at once
    return runs


def releases(store: EventStore, run_id: uuid.UUID, tenant: str = "default") -> int:
    return sum(
        1 for e in store.read_stream(ev.run_stream(run_id), tenant=tenant) if e.type == ev.RUN_RELEASED
    )


def test_a_tick_drains_every_tenants_due_runs_pass_after_pass(engine: Engine, store: EventStore) -> None:
    mine, theirs = ended_runs(engine, 7), ended_runs(engine, 2, tenant="acme")
    going = engine.start("hold").run_id
    project_runs(engine.store)
    worker = RetentionWorker(engine, RetentionSettings(**DUE))
    tick = worker.tick()
    # 7 runs of one workflow in passes of 3 (3, 3, 1), without the tables catching up in between.
    assert tick.released == 9
    assert [(a.tenant, a.done) for a in tick.actions or []] == [
        ("acme", 2),
        ("default", 3),
        ("default", 3),
        ("default", 1),
    ]
    assert all(releases(store, r) == 1 for r in mine)
    assert all(releases(store, r, "acme") == 1 for r in theirs)
    assert releases(store, going) == 0
    # The tables have not caught up: a tick finds the released runs again, releases none twice, and ends.
    assert worker.tick().released == 0
    project_runs(engine.store)
    assert worker.tick().actions == []
    assert all(releases(store, r) == 1 for r in mine)


def test_one_tick_at_a_time_across_processes_and_each_run_released_once(
    engine: Engine, store: EventStore
) -> None:
    runs = ended_runs(engine, 10)
    project_runs(engine.store)
    worker = RetentionWorker(engine, RetentionSettings(**DUE))
    with _sole_pass(store) as held_here:  # another process's tick, in progress
        assert held_here
        assert worker.tick().actions is None
    assert all(releases(store, r) == 0 for r in runs)

    ticks: list[Any] = []
    errors: list[BaseException] = []

    def tick() -> None:
        try:
            ticks.append(RetentionWorker(engine, RetentionSettings(**DUE)).tick())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=tick) for _ in range(3)]
    for t in threads:
        t.start()
    joined(*threads)
    assert errors == []
    assert sum(t.released for t in ticks) == 10
    assert all(releases(store, r) == 1 for r in runs)


def test_the_role_passes_every_interval_and_is_off_at_0(engine: Engine, store: EventStore) -> None:
    off = RetentionWorker(engine, RetentionSettings(**DUE, retention_interval=0))
    stopped = threading.Thread(target=off.run)
    stopped.start()
    first = ended_runs(engine, 2)
    project_runs(engine.store)
    off.stop()
    joined(stopped)
    assert all(releases(store, r) == 0 for r in first), "interval 0: no passes"

    worker = RetentionWorker(engine, RetentionSettings(**DUE, retention_interval=0.1))
    running = threading.Thread(target=worker.run)
    running.start()
    try:
        wait_until(lambda: all(releases(store, r) == 1 for r in first), what="the first tick's releases")
        later = ended_runs(engine, 2)
        project_runs(engine.store)
        wait_until(lambda: all(releases(store, r) == 1 for r in later), what="a later tick's releases")
    finally:
        worker.stop()
        joined(running)
    assert not worker.database_state().waiting


def test_the_interval_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RetentionSettings().retention_interval == 600
    monkeypatch.setenv("LEDGERFLOW_RETENTION_INTERVAL", "0")
    assert RetentionSettings().retention_interval == 0
    monkeypatch.setenv("LEDGERFLOW_RETENTION_INTERVAL", "-1")
    with pytest.raises(ValueError, match="retention_interval"):
        RetentionSettings()


def waiting_for_a_lock(store: EventStore) -> list[int]:
    """This database's backends waiting for a lock (a fresh look: pg_stat_activity is read once per
    transaction)."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall()
    return [int(r[0]) for r in rows]


def test_a_tick_the_database_stopped_is_finished_once_it_answers_not_an_interval_later(
    engine: Engine, store: EventStore
) -> None:
    runs = ended_runs(engine, 7)
    project_runs(engine.store)
    worker = RetentionWorker(engine, RetentionSettings(**DUE, retention_interval=3600))
    # The tick's second pass (runs are taken newest first, 3 a pass) waits on a run's stream row, its
    # transaction open, until the drill ends its connection: the database gone for the tick.
    with psycopg.connect(store.url) as holder:
        holder.execute(
            "SELECT 1 FROM ledgerflow.streams WHERE stream_id = %s FOR UPDATE", (ev.run_stream(runs[3]),)
        )
        running = threading.Thread(target=worker.run)
        running.start()
        try:
            blocked = wait_until(lambda: waiting_for_a_lock(store), what="the tick waiting in its 2nd pass")
            with store.pool.connection() as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", blocked[:1])
            holder.rollback()
            wait_until(lambda: all(releases(store, r) == 1 for r in runs), what="the tick finished at once")
        finally:
            worker.stop()
            joined(running)
    assert worker.database_state().outages == 1
    assert all(releases(store, r) == 1 for r in runs)

"""Workflow runs end to end with an in-process worker: DAG order, outputs, retries, keys."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from eventstore import EventStore, IdempotencyConflictError
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker
from workflows.run_state import RunState
from workflows.testing import running_worker


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    with running_worker(
        engine,
        registry,
        WorkerSettings(concurrency=4, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2),
        name="test-worker",
    ) as w:
        yield w


def finished(engine: Engine, run_id: uuid.UUID) -> RunState | None:
    run = engine.load(run_id)
    return None if run.active else run


def calls(engine: Engine, run_id: uuid.UUID) -> list[tuple[str, int]]:
    with engine.store.pool.connection() as conn:
        exists = conn.execute("SELECT to_regclass('public.calls')").fetchone()
        if not exists or exists[0] is None:
            return []
        rows = conn.execute(
            "SELECT what, attempt FROM public.calls WHERE run_id = %s ORDER BY at", (run_id,)
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_a_linear_run_completes_in_order(engine: Engine, worker: WorkflowWorker) -> None:
    started = engine.start("linear", input={"n": 5})
    run = wait_until(lambda: finished(engine, started.run_id), timeout=30, what="the run to finish")
    assert run.status == "succeeded"
    assert run.node("third").output == {"n": 11}
    assert calls(engine, started.run_id) == [("first", 1), ("second", 1), ("third", 1)]


def test_fan_out_and_fan_in(engine: Engine, worker: WorkflowWorker) -> None:
    started = engine.start("diamond")
    run = wait_until(lambda: finished(engine, started.run_id), timeout=30, what="the run to finish")
    assert run.status == "succeeded"
    assert run.node("join").output == 9


def test_failed_attempts_are_retried_with_backoff(engine: Engine, worker: WorkflowWorker) -> None:
    started = engine.start("flaky", input={"fail_times": 2})
    run = wait_until(lambda: finished(engine, started.run_id), timeout=30, what="the run to finish")
    assert run.status == "succeeded"
    assert calls(engine, started.run_id) == [("flaky", 1), ("flaky", 2), ("flaky", 3), ("after_flaky", 1)]
    assert run.node("flaky").generation == 3


def test_a_node_out_of_attempts_fails_the_run_and_retry_resumes_from_it(
    engine: Engine, worker: WorkflowWorker
) -> None:
    started = engine.start("flaky", input={"fail_times": 3})
    run = wait_until(lambda: finished(engine, started.run_id), timeout=30, what="the run to fail")
    assert run.status == "failed"
    assert "attempt 3 fails on purpose" in (run.error or "")
    engine.retry(started.run_id)
    run = wait_until(lambda: finished(engine, started.run_id), timeout=30, what="the retried run to finish")
    assert run.status == "succeeded"
    assert [c for c in calls(engine, started.run_id) if c[0] == "after_flaky"] == [("after_flaky", 1)]


def test_one_active_run_per_key(engine: Engine) -> None:
    first = engine.start("linear", key="doc-1")
    again = engine.start("linear", key="doc-1")
    other = engine.start("linear", key="doc-2")
    assert first.created
    assert not again.created
    assert again.run_id == first.run_id
    assert other.run_id != first.run_id


def test_idempotent_start(engine: Engine) -> None:
    first = engine.start("linear", input={"n": 1}, idempotency_key="req-1")
    again = engine.start("linear", input={"n": 1}, idempotency_key="req-1")
    assert (again.run_id, again.created) == (first.run_id, False)
    with pytest.raises(IdempotencyConflictError):
        engine.start("linear", input={"n": 2}, idempotency_key="req-1")

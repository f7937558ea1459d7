"""Limits on steps: `ctx.step(key, fn, limits=[...])` runs `fn` only with a slot; a node refused one
suspends itself (no thread held) and asks again when it wakes; a hold ends with its step, or its claim."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from eventstore import EventStore
from tests.waiting import wait_until
from workflows import (
    Engine,
    NodeContext,
    WorkerSettings,
    Workflow,
    WorkflowRegistry,
    WorkflowWorker,
    queue_claims,
    queue_run_changes,
)
from workflows import events as ev
from workflows.limits import declare, usage

CALL_SECONDS = 0.15
_lock = threading.Lock()
_calls: list[tuple[float, float]] = []

registry = WorkflowRegistry()
registry.limit("llm", concurrency=1)
stepped = Workflow("stepped")


@stepped.node()
def work(ctx: NodeContext) -> int:
    def llm() -> int:
        began = time.monotonic()
        threading.Event().wait(CALL_SECONDS)
        with _lock:
            _calls.append((began, time.monotonic()))
        return 7

    return ctx.step("llm", llm, limits=["llm"]) + ctx.step("free", lambda: 1)


registry.register(stepped)


@pytest.fixture
def workers(store: EventStore) -> Iterator[Engine]:
    engine = Engine(store, registry)
    settings = WorkerSettings(concurrency=4, lease_ttl=10, heartbeat_interval=1, poll_interval=0.05)
    running = [WorkflowWorker(engine, registry, settings, name=f"steps-{i}") for i in range(2)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in running]
    for t in threads:
        t.start()
    yield engine
    for w in running:
        w.stop()
    for t in threads:
        t.join(timeout=15)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_limited_step_runs_one_at_a_time_and_waiting_nodes_let_go_their_thread(
    store: EventStore, workers: Engine
) -> None:
    _calls.clear()
    engine = workers
    run_ids = [engine.start("stepped", input={"n": n}).run_id for n in range(6)]
    wait_until(lambda: all(not engine.load(r).active for r in run_ids), timeout=60, what="every run")
    assert len(_calls) == 6  # each step ran once
    assert max_overlap(_calls) == 1  # eight node threads, one slot
    suspended = 0
    for run_id in run_ids:
        run = engine.load(run_id)
        assert run.status == "succeeded"
        assert run.node("work").output == 8
        events = store.read_stream(ev.run_stream(run_id), limit=10_000)
        assert sum(e.type == ev.STEP_RECORDED and e.data["key"] == "llm" for e in events) == 1
        suspended += sum(e.type == ev.NODE_WAITING for e in events)
    assert suspended > 0, "no node had to wait for the slot"
    with store.pool.connection() as conn:
        (llm,) = usage(conn)
        holds = conn.execute("SELECT count(*) FROM ledgerflow.workflow_limit_holds").fetchone()
    assert llm.in_use == 0
    assert holds == (0,)


def test_a_hold_stops_counting_when_its_claim_ends(store: EventStore) -> None:
    engine = Engine(store, registry)
    with store.pool.connection() as conn:
        declare(conn, registry, worker="t/1")
    engine.start("stepped", input={"n": 1})
    with store.pool.connection() as conn:
        (claim,) = queue_claims.claim(
            conn, worker_name="w", instance="i", workflows=[("stepped", "1")], limit=1, ttl=30
        )
        row = conn.execute(
            "SELECT admitted FROM ledgerflow.wf_limits_hold(%s, %s, %s, ARRAY['llm'])",
            (claim.run_id, claim.node, claim.token),
        ).fetchone()
        assert row == (True,)
        assert usage(conn)[0].in_use == 1
        # Its worker died; the node is handed back (a new claim would carry a new token).
        assert queue_run_changes.release(conn, claim.run_id, claim.node, claim.token)
        assert usage(conn)[0].in_use == 0

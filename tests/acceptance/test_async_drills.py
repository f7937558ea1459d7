"""SIGKILL drills on real `ledgerflow worker` processes running `async def` nodes (tests/async_flows.py).

A worker killed while its async nodes await their calls: every run completes, no memoized step or
checkpointed item recorded before the kill is paid again, and the workflow tables equal a rebuild.
"""

from __future__ import annotations

import random
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from eventstore import EventStore
from tests.acceptance.drill_workers import kill, sigkill_at_random_moments
from tests.acceptance.drill_workers import start_worker as drill_worker
from tests.acceptance.test_workflow_drills import all_done, assert_tables_equal_rebuild, calls_by_run
from tests.async_flows import create_calls_table, expected_total, registry
from tests.waiting import wait_until
from workflows import Engine
from workflows import events as ev

pytestmark = pytest.mark.drill


def start_worker(url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    return drill_worker(url, name, log, workflows="tests.async_flows:registry", concurrency=2)


def recorded_steps(store: EventStore, run_id: uuid.UUID) -> dict[str, int]:
    """What the run's log recorded, by the name its calls are counted under: the attempt that did it."""
    recorded: dict[str, int] = {}
    for e in store.read_stream(ev.run_stream(run_id), limit=100_000):
        if e.type == ev.NODE_SUCCEEDED:
            recorded.setdefault(e.data["node"], e.data["attempt"])
        elif e.type == ev.NODE_CHECKPOINT:
            recorded.setdefault(f"item:{e.data['item']}", e.data["attempt"])
        elif e.type == ev.STEP_RECORDED:
            recorded.setdefault(f"step:{e.data['key']}", e.data["attempt"])
    return recorded


def assert_nothing_paid_after_it_was_recorded(store: EventStore, run_ids: list[uuid.UUID]) -> None:
    calls = calls_by_run(store)
    for run_id in run_ids:
        recorded = recorded_steps(store, run_id)
        for what, attempt in calls[run_id]:
            done_in = recorded.get(what)
            assert done_in is None or attempt <= done_in, (
                f"run {run_id}: {what} ran again in attempt {attempt}, recorded in attempt {done_in}"
            )


def test_an_async_step_is_paid_once_across_a_sigkill(store: EventStore, tmp_path: Path) -> None:
    engine = Engine(store, registry)
    run_ids = [engine.start("async_paid", input={"hold": 1.5}).run_id for _ in range(8)]
    log = tmp_path / "workers.log"
    create_calls_table(store.url)
    worker = start_worker(store.url, "paid-a", log)
    try:
        # Mid-node: every run's first call is recorded, and each body awaits before its second.
        wait_until(
            lambda: all("step:charge" in recorded_steps(store, r) for r in run_ids),
            timeout=60,
            what="every first step to be recorded",
        )
        assert not any("step:refund" in recorded_steps(store, r) for r in run_ids)
        kill(worker)
        worker = start_worker(store.url, "paid-a", log)  # the same name takes its nodes back at once
        wait_until(lambda: all_done(engine, run_ids), timeout=60, what="every run to finish")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    calls = calls_by_run(store)
    for run_id in run_ids:
        run = engine.load(run_id)
        assert run.status == "succeeded", run.error
        assert run.node("charge").output == ["receipt:charge", "receipt:refund"]
        assert run.node("charge").attempt == 2, "the node ran again after the kill"
        paid = [what for what, _ in calls[run_id]]
        assert paid.count("step:charge") == 1, "the step recorded before the kill was paid again"
        assert paid.count("step:refund") == 1
    assert_nothing_paid_after_it_was_recorded(store, run_ids)


def test_sigkill_async_workers_at_random_moments(store: EventStore, tmp_path: Path) -> None:
    engine = Engine(store, registry)
    run_ids = [engine.start("async_pages", input={"items": 8}).run_id for _ in range(8)]
    log = tmp_path / "workers.log"
    create_calls_table(store.url)
    kills = sigkill_at_random_moments(
        store,
        lambda name: start_worker(store.url, name, log),
        lambda: all_done(engine, run_ids),
        prefix="async",
        rng=random.Random(12),
        most=5,
        pause=0.4,
    )
    assert kills >= 3
    for run_id in run_ids:
        run = engine.load(run_id)
        assert run.status == "succeeded", run.error
        assert run.node("total").output == expected_total(8)
    assert_nothing_paid_after_it_was_recorded(store, run_ids)
    reclaims = sum(
        e.type == ev.NODE_RECLAIMED
        for r in run_ids
        for e in store.read_stream(ev.run_stream(r), limit=100_000)
    )
    assert reclaims > 0, "the drill never interrupted a node"
    assert_tables_equal_rebuild(store)

"""SIGKILL and SIGSTOP drills on real `ledgerflow worker` processes.

After workers are killed at random moments, many times: every run completes; no completed node ran
again; no memoized step or checkpointed item ran again after it was recorded; and the workflow tables
equal a rebuild. A worker paused past its lease cannot write anything afterwards.
"""

from __future__ import annotations

import random
import signal
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from eventstore import EventStore
from projector import ProjectorWorker, WorkerSettings, rebuild
from projector.digest import projection_digest
from tests.acceptance.drill_workers import sigkill_at_random_moments, start_worker
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, workflow_tables
from workflows import events as ev

pytestmark = pytest.mark.drill


def calls_by_run(store: EventStore) -> dict[uuid.UUID, list[tuple[str, int]]]:
    found: dict[uuid.UUID, list[tuple[str, int]]] = defaultdict(list)
    with store.pool.connection() as conn:
        for run_id, what, attempt in conn.execute(
            "SELECT run_id, what, attempt FROM public.calls"
        ).fetchall():
            found[run_id].append((what, attempt))
    return found


def all_done(engine: Engine, run_ids: list[uuid.UUID]) -> bool:
    return all(not engine.load(r).active for r in run_ids)


def assert_nothing_paid_twice(store: EventStore, engine: Engine, run_ids: list[uuid.UUID]) -> None:
    calls = calls_by_run(store)
    for run_id in run_ids:
        run = engine.load(run_id)
        assert run.status == "succeeded", f"run {run_id} ended {run.status}: {run.error}"
        events = store.read_stream(ev.run_stream(run_id), limit=100_000)
        # When each thing was recorded, by attempt: nothing may run in a later attempt than that.
        recorded: dict[str, int] = {}
        for e in events:
            if e.type == ev.NODE_SUCCEEDED:
                recorded[e.data["node"]] = e.data["attempt"]
            elif e.type == ev.NODE_CHECKPOINT:
                recorded.setdefault(f"item:{e.data['item']}", e.data["attempt"])
            elif e.type == ev.STEP_RECORDED:
                recorded.setdefault(f"step:{e.data['key']}", e.data["attempt"])
        for what, attempt in calls[run_id]:
            done_in = recorded.get(what)
            assert done_in is None or attempt <= done_in, (
                f"run {run_id}: {what} ran again in attempt {attempt}, "
                f"after being recorded in attempt {done_in}"
            )
        assert run.node("combine").output == sum(i * i for i in range(10)) + 50


def assert_tables_equal_rebuild(store: EventStore) -> None:
    projector = ProjectorWorker(store, [workflow_tables], WorkerSettings(batch_size=200))
    projector.run_until_caught_up()
    with store.pool.connection() as conn:
        live = projection_digest(conn, workflow_tables, workflow_tables.schema)
        statuses = conn.execute("SELECT DISTINCT status FROM ledgerflow.workflow_runs").fetchall()
    assert statuses == [("succeeded",)]
    assert rebuild(store, workflow_tables).digest == live
    projector.release_all()


def test_sigkill_workers_at_random_moments(store: EventStore, tmp_path: Path) -> None:
    engine = Engine(store, registry)
    run_ids = [engine.start("drill", input={"items": 10}).run_id for _ in range(12)]
    log = tmp_path / "workers.log"
    kills = sigkill_at_random_moments(
        store,
        lambda name: start_worker(store.url, name, log),
        lambda: all_done(engine, run_ids),
        prefix="drill",
        rng=random.Random(11),
        most=12,
        pause=0.3,
    )
    assert kills >= 3
    assert_nothing_paid_twice(store, engine, run_ids)
    reclaims = sum(
        e.type == ev.NODE_RECLAIMED
        for r in run_ids
        for e in store.read_stream(ev.run_stream(r), limit=100_000)
    )
    assert reclaims > 0, "the drill never interrupted a node"
    assert_tables_equal_rebuild(store)


def test_a_worker_paused_past_its_lease_cannot_write(store: EventStore, tmp_path: Path) -> None:
    engine = Engine(store, registry)
    run_ids = [engine.start("drill", input={"items": 10}).run_id for _ in range(6)]
    log = tmp_path / "workers.log"
    paused = start_worker(store.url, "paused", log, lease_ttl=1.5)

    def running_on_paused() -> bool:
        return any(
            n.status == "running" and (n.worker or "").startswith("paused/")
            for r in run_ids
            for n in engine.load(r).nodes.values()
        )

    wait_until(running_on_paused, timeout=30, what="the first worker to run nodes")
    paused.send_signal(signal.SIGSTOP)
    taker = start_worker(store.url, "taker", log, lease_ttl=1.5)
    try:
        wait_until(
            lambda: all_done(engine, run_ids), timeout=120, what="the runs to finish on the other worker"
        )
        before = {r: engine.load(r).version for r in run_ids}
        paused.send_signal(signal.SIGCONT)
        # Give the woken worker the chance to try: its next heartbeat finds its leases gone.
        wait_until(
            lambda: (
                b'"workflow_lease_lost"' in log.read_bytes()
                or b'"workflow_node_lease_lost"' in log.read_bytes()
            ),
            timeout=30,
            what="the paused worker to notice",
        )
        assert {r: engine.load(r).version for r in run_ids} == before, "the paused worker wrote after losing"
    finally:
        for w in (paused, taker):
            w.send_signal(signal.SIGCONT)
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=30)
    assert_nothing_paid_twice(store, engine, run_ids)

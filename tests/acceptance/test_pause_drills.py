"""Drills with real `ledgerflow worker` processes: runs paused mid-node survive a SIGKILL of their worker
(no node of a paused run starts until its resume, and nothing recorded is paid again), and a cancelled
parent takes three levels of children with it, while a worker is killed."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from eventstore import EventStore
from projector import ProjectorWorker, WorkerSettings
from tests.acceptance.drill_workers import kill
from tests.acceptance.drill_workers import start_worker as drill_worker
from tests.acceptance.test_async_drills import assert_nothing_paid_after_it_was_recorded
from tests.acceptance.test_workflow_drills import (
    all_done,
    assert_tables_equal_rebuild,
)
from tests.children_flows import registry as children_registry
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, workflow_tables
from workflows import events as ev

pytestmark = pytest.mark.drill


def queue_statuses(store: EventStore, run_ids: list[uuid.UUID]) -> set[str]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT DISTINCT status FROM ledgerflow.workflow_queue WHERE run_id = ANY(%s)", (run_ids,)
        ).fetchall()
    return {r[0] for r in rows}


def checkpointed(store: EventStore, run_id: uuid.UUID) -> bool:
    return any(e.type == ev.NODE_CHECKPOINT for e in store.read_stream(ev.run_stream(run_id), limit=100_000))


def claims_while_paused(store: EventStore, run_id: uuid.UUID) -> list[str]:
    """The nodes claimed between the run's pause and its resume (the stream's order is the commit order)."""
    paused, claimed = False, []
    for e in store.read_stream(ev.run_stream(run_id), limit=100_000):
        if e.type == ev.RUN_PAUSED:
            paused = True
        elif e.type == ev.RUN_RESUMED:
            paused = False
        elif e.type == ev.NODE_CLAIMED and paused:
            claimed.append(e.data["node"])
    return claimed


def test_runs_paused_mid_node_wait_out_a_sigkill_and_resume_where_they_were(
    store: EventStore, tmp_path: Path
) -> None:
    engine = Engine(store, registry)
    run_ids = [engine.start("drill", input={"items": 200}).run_id for _ in range(4)]
    log = tmp_path / "workers.log"
    worker = drill_worker(store.url, "pause-a", log)
    try:
        wait_until(
            lambda: all(checkpointed(store, r) for r in run_ids), timeout=60, what="every run mid-node"
        )
        for i, run_id in enumerate(run_ids):
            engine.pause(run_id, interrupt_running=i % 2 == 0)
        kill(worker)
        worker = drill_worker(store.url, "pause-a", log)  # the same name takes its nodes back at once
        # Taken back, and held: every row of the paused runs waits for the resume (none parked).
        wait_until(lambda: queue_statuses(store, run_ids) == {"paused"}, timeout=60, what="every row held")
        projector = ProjectorWorker(store, [workflow_tables], WorkerSettings(batch_size=200))
        projector.run_until_caught_up()  # the tables, incrementally, while the runs are paused
        projector.release_all()
        with store.pool.connection() as conn:
            shown = conn.execute(
                "SELECT DISTINCT status FROM ledgerflow.workflow_runs WHERE run_id = ANY(%s)", (run_ids,)
            ).fetchall()
        assert shown == [("paused",)]
        for run_id in run_ids:
            engine.resume(run_id)
        try:
            wait_until(lambda: all_done(engine, run_ids), timeout=120, what="every run to finish")
        except AssertionError:
            with store.pool.connection() as conn:
                rows = conn.execute(
                    "SELECT run_id, node, status, worker_name, cancel_requested, ready_at, lease_expires_at "
                    "FROM ledgerflow.workflow_queue"
                ).fetchall()
            raise AssertionError(f"runs not done; queue: {rows}") from None
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    for run_id in run_ids:
        assert claims_while_paused(store, run_id) == [], f"run {run_id} started a node while paused"
    for run_id in run_ids:
        run = engine.load(run_id)
        assert run.status == "succeeded", run.error
        assert run.node("combine").output == sum(i * i for i in range(200)) + 50
    assert_nothing_paid_after_it_was_recorded(store, run_ids)
    assert_tables_equal_rebuild(store)


def test_a_cancelled_parent_takes_three_levels_of_children_with_it(store: EventStore, tmp_path: Path) -> None:
    engine = Engine(store, children_registry)
    root = engine.start("tree", input={"depth": 2, "policies": ["cancel", "terminate"]}).run_id
    log = tmp_path / "workers.log"
    workers = [
        drill_worker(store.url, name, log, workflows="tests.children_flows:registry")
        for name in ("tree-a", "tree-b")
    ]

    def tree() -> list[uuid.UUID]:
        found, todo = [], [root]
        while todo:
            run_id = todo.pop()
            found.append(run_id)
            run = engine.load(run_id)
            todo += [uuid.UUID(c) for n in run.nodes.values() for c in n.children.values()]
        return found

    try:
        # 1 + 2 + 4 runs, every one's node waiting for a signal that never comes.
        wait_until(
            lambda: (
                len(runs := tree()) == 7
                and all(engine.load(r).node("spawn").status == "waiting" for r in runs)
            ),
            timeout=60,
            what="three levels of runs",
        )
        engine.cancel(root)
        kill(workers[0])  # the applier of the children's projection may die mid-way: the other takes over
        runs = tree()
        wait_until(
            lambda: all(engine.load(r).status == "cancelled" for r in runs),
            timeout=60,
            what="every run cancelled",
        )
    finally:
        for w in workers[1:]:
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=30)
    for run_id in runs:
        cancelled = [e for e in store.read_stream(ev.run_stream(run_id)) if e.type == ev.RUN_CANCELLED]
        assert len(cancelled) == 1, f"run {run_id} was cancelled {len(cancelled)} times"

"""SIGKILL and SIGSTOP drills on real `ledgerflow worker` processes.

After workers are killed at random moments, many times: every run completes; no completed node ran
again; no memoized step or checkpointed item ran again after it was recorded; and the workflow tables
equal a rebuild. A worker paused past its lease cannot write anything afterwards.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from eventstore import EventStore
from projector import ProjectorWorker, WorkerSettings, rebuild
from projector.digest import projection_digest
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, workflow_tables
from workflows import events as ev

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.drill


def start_worker(
    url: str,
    name: str,
    log: Path,
    lease_ttl: float = 2.0,
    workflows: str = "tests.flows:registry",
    concurrency: int = 4,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A real `ledgerflow worker` process for the drills, logging JSON lines to `log`; `env` adds to (or
    overrides) its environment."""
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": workflows,
        "LEDGERFLOW_WORKFLOW_LEASE_TTL": str(lease_ttl),
        "LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL": str(lease_ttl / 4),
        "LEDGERFLOW_RECOVERY_INTERVAL": "0.5",
        "LEDGERFLOW_WORKER_CONCURRENCY": str(concurrency),
        "LEDGERFLOW_LOG_FORMAT": "json",
        **(env or {}),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "worker", "--name", name],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def calls_by_run(store: EventStore) -> dict[uuid.UUID, list[tuple[str, int]]]:
    found: dict[uuid.UUID, list[tuple[str, int]]] = defaultdict(list)
    with store.pool.connection() as conn:
        for run_id, what, attempt in conn.execute(
            "SELECT run_id, what, attempt FROM public.calls"
        ).fetchall():
            found[run_id].append((what, attempt))
    return found


def db_now(store: EventStore) -> datetime:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def holds_nodes(store: EventStore, worker_name: str, since: datetime) -> bool:
    """True once a worker of this name claimed a node after `since` (not a dead predecessor's claim)."""
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_queue "
            "WHERE status = 'claimed' AND worker_name = %s AND claimed_at > %s",
            (worker_name, since),
        ).fetchone()
    return row is not None and row[0] > 0


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
    rng = random.Random(11)
    kills = 0
    name, since = "drill-a", db_now(store)
    worker = start_worker(store.url, name, log)
    try:
        while not all_done(engine, run_ids) and kills < 12:
            # Kill it while it works: once it holds a node, after a random extra moment.
            wait_until(
                lambda n=name, t=since: holds_nodes(store, n, t) or all_done(engine, run_ids),
                timeout=60,
                what="the worker to claim a node",
            )
            threading.Event().wait(rng.uniform(0, 0.3))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            # Half the time the same name comes back (takes its nodes back at once); else another worker
            # must wait for the leases to lapse.
            name, since = ("drill-a" if kills % 2 else f"drill-{kills}"), db_now(store)
            worker = start_worker(store.url, name, log)
        wait_until(lambda: all_done(engine, run_ids), timeout=120, what="every run to finish")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
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

"""Drill: a partitioned projection caught up by three real `ledgerflow projector` processes while events
are appended, one of them SIGKILLed twice mid-work; it ends equal to its unpartitioned twin."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from eventstore import AppendResult, EventStore, NewEvent
from projector import ProjectorWorker, WorkerSettings, list_runs, projection_health, verify, wait_for
from projector.digest import projection_digest
from tests.acceptance.drill_workers import projector_running
from tests.projections import partitioned_counter, twin_counter
from tests.waiting import joined, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.drill


def start_worker(database_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": database_url,
        "LEDGERFLOW_PROJECTIONS": "tests.projections:partitioned_counter",
        "LEDGERFLOW_PROJECTOR_LEASE_TTL": "1.0",
        "LEDGERFLOW_PROJECTOR_HEARTBEAT_INTERVAL": "0.25",
        "LEDGERFLOW_PROJECTOR_BATCH_SIZE": "25",
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "projector"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _applied(store: EventStore, schema: str) -> tuple[int, int]:
    with store.pool.connection() as conn:
        row = conn.execute(f'SELECT count(*), coalesce(max(times), 0) FROM "{schema}".applied').fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _holding_workers(store: EventStore, workers: list[subprocess.Popen[bytes]]) -> list[int]:
    """Indexes of the worker processes holding a segment now (a worker's id holds its pid)."""
    pids = {int(owner.split(":")[1]) for owner in _owners(store)}
    return [i for i, w in enumerate(workers) if w.pid in pids]


def _owners(store: EventStore) -> set[str]:
    return {g.owner for g in projection_health(store, [partitioned_counter])[0].segments if g.owner}


def test_three_workers_one_killed_twice_equal_the_twin(store: EventStore, tmp_path: Path) -> None:
    rng = random.Random(25)
    ProjectorWorker(store, [partitioned_counter]).prepare()  # its tables exist before the first worker runs
    for i in range(60):  # a backlog over many streams, so every segment has work
        store.append(f"drill-{i}", [NewEvent("Add", {"amount": i * 10 + k}) for k in range(20)])
    done = threading.Event()
    last: list[AppendResult] = []

    def append() -> None:
        i = 0
        while not done.is_set():
            last[:] = [store.append(f"drill-{i % 37}", [NewEvent("Add", {"amount": i})])]
            i += 1

    appender = threading.Thread(target=append, daemon=True)
    appender.start()
    log = tmp_path / "workers.log"
    workers = [start_worker(store.url, log) for _ in range(3)]
    killed = 0
    try:
        for _ in range(2):
            # Kill the first worker while it holds segments and applies them.
            before = _applied(store, partitioned_counter.schema)[0]
            wait_until(
                lambda b=before: _applied(store, partitioned_counter.schema)[0] > b + 50,
                timeout=60,
                what="the workers to apply events",
            )
            # The victim holds segments (a worker with none would prove nothing when killed).
            holders = wait_until(
                lambda: _holding_workers(store, workers), timeout=60, what="a segment holder"
            )
            victim = rng.choice(holders)
            threading.Event().wait(rng.uniform(0, 0.3))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait()
            killed += 1
            workers[victim] = start_worker(store.url, log)
        # Segments spread: more than one worker holds some (at most ceil(4 / 3) = 2 each).
        wait_until(lambda: len(_owners(store)) >= 2, timeout=60, what="the segments to spread")
        # The last one started may still be importing on a slow host: the SIGTERM below is for
        # running ones.
        wait_until(
            lambda: all(projector_running(log, w) for w in workers), timeout=60, what="every worker to run"
        )
        done.set()
        joined(appender)
        wait_for(store, partitioned_counter, last[0], timeout=120)
    finally:
        done.set()
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
    assert codes == [0, 0, 0], log.read_text()[-3000:]

    # The twin: the same handlers, unpartitioned, in a schema of its own, caught up here.
    twin = ProjectorWorker(store, [twin_counter], WorkerSettings(batch_size=500))
    twin.run_until_caught_up(timeout=120)
    twin.release_all()
    with store.pool.connection() as conn:
        total = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
        live = projection_digest(conn, partitioned_counter, partitioned_counter.schema)
        assert live == projection_digest(conn, twin_counter, twin_counter.schema)
        runs = list_runs(conn, partitioned_counter.name, 200)
    assert total is not None
    assert _applied(store, partitioned_counter.schema) == (total[0], 1), (
        "an event was missed or applied twice"
    )
    assert verify(store, partitioned_counter).equal
    # Every segment had catch-up runs of its own, by more than one worker over the drill.
    catch_ups = [r for r in runs if r.kind == "catch_up"]
    assert {r.projection for r in catch_ups} == {f"{partitioned_counter.name}#{k}" for k in range(4)}
    assert len({r.owner for r in catch_ups}) >= 3
    assert killed == 2

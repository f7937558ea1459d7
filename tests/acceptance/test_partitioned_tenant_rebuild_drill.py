"""Drill: a tenant's rebuild of a partitioned per-tenant projection (a real `ledgerflow projections rebuild
--tenant` process) SIGKILLed while its tenant is fenced in every segment, and a real `ledgerflow projector`
SIGKILLed mid-work, while both tenants' events are appended: the projector workers take the run for
abandoned, each segment lifts its own fence, and every event ends applied once, the projection equal to
its rebuild."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from eventstore import AppendResult, EventStore, NewEvent
from projector import ProjectorWorker, verify, wait_for
from tests.acceptance.drill_workers import projector_running
from tests.projections import tenant_partitioned_counter as counter
from tests.waiting import joined, wait_until

ROOT = Path(__file__).resolve().parents[2]
A, B = "tenant-a", "tenant-b"
pytestmark = pytest.mark.drill


def start(database_url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": database_url,
        "LEDGERFLOW_PROJECTIONS": "tests.projections:tenant_partitioned_counter",
        "LEDGERFLOW_PROJECTOR_LEASE_TTL": "1.0",
        "LEDGERFLOW_PROJECTOR_HEARTBEAT_INTERVAL": "0.25",
        "LEDGERFLOW_PROJECTOR_BATCH_SIZE": "10",
        # Above the rebuild's heartbeat interval (5 s), so a live rebuild is never taken for abandoned.
        "LEDGERFLOW_ABANDONED_AFTER": "6",
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def fences(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.projection_tenant_fences").fetchone()
    assert row is not None
    return int(row[0])


def counted(store: EventStore, tenant: str) -> int:
    """The tenant's events in the log."""
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.events WHERE tenant = %s", (tenant,)).fetchone()
    assert row is not None
    return int(row[0])


def run_status(store: EventStore) -> str | None:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT status FROM ledgerflow.projection_runs WHERE kind = 'rebuild' AND tenant = %s", (A,)
        ).fetchone()
    return None if row is None else str(row[0])


def test_a_killed_tenant_rebuild_and_a_killed_worker_lose_and_double_nothing(
    store: EventStore, tmp_path: Path
) -> None:
    ProjectorWorker(store, [counter]).prepare()
    for i in range(12):
        for tenant in (A, B):
            store.append(f"order-{i}", [NewEvent("Placed", {}) for _ in range(3)], tenant=tenant)
    log = tmp_path / "drill.log"
    workers = [start(store.url, log, "projector") for _ in range(2)]
    done = threading.Event()
    last: list[AppendResult] = []
    # B's events throughout, A's too once A is fenced (before, a batch applying one of A's would wait for
    # the row held below, holding its segment's cursor row, and the fence would wait for that).
    tenants = [B]

    def append() -> None:
        i = 0
        while not done.is_set():
            tenant = tenants[i % len(tenants)]
            last[:] = [store.append(f"order-{i % 12}", [NewEvent("Placed", {})], tenant=tenant)]
            i += 1
            done.wait(0.005)  # a steady trickle, not a flood: the drill is about the fences

    appender = threading.Thread(target=append, daemon=True)
    try:
        wait_for(store, counter, store.append("order-0", [NewEvent("Placed", {})], tenant=B), timeout=60)
        appender.start()
        # Hold one of A's rows: the rebuild fences A in every segment, then waits to replace A's rows.
        holder = psycopg.connect(store.url, autocommit=False)
        holder.execute(f'SELECT 1 FROM "{counter.schema}".counts WHERE tenant = %s LIMIT 1 FOR UPDATE', (A,))
        rebuilding = start(store.url, log, "projections", "rebuild", counter.name, "--tenant", A)
        wait_until(lambda: fences(store) == counter.partitions, timeout=60, what="A fenced in every segment")
        tenants.append(A)
        wait_until(lambda: counted(store, A) > 12 * 3 + 20, timeout=60, what="A's events left by batches")
        workers[0].send_signal(signal.SIGKILL)  # a segment worker, mid-work
        workers[0].wait()
        workers[0] = start(store.url, log, "projector")
        rebuilding.send_signal(signal.SIGKILL)  # the rebuild, fenced, its replacement waiting
        rebuilding.wait()
        holder.rollback()
        holder.close()
        # Its heartbeat stops: the workers take the run for abandoned, and each segment's next batch lifts
        # its fence, applying A's events the batches left.
        wait_until(lambda: run_status(store) == "abandoned", timeout=60, what="the run taken for abandoned")
        wait_until(lambda: fences(store) == 0, timeout=60, what="every segment to lift its fence")
        # The worker started again may still be importing on a slow host: the SIGTERM below is for
        # running ones.
        wait_until(
            lambda: all(projector_running(log, w) for w in workers), timeout=60, what="both workers to run"
        )
        done.set()
        joined(appender)
        wait_for(store, counter, last[0], timeout=60)
    finally:
        done.set()
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=30) for w in workers]
    assert codes == [0, 0], log.read_text()[-3000:]
    with store.pool.connection() as conn:
        total = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
        applied = conn.execute(
            f'SELECT count(*), coalesce(max(times), 0) FROM "{counter.schema}".applied'
        ).fetchone()
    assert total is not None
    assert applied == (total[0], 1), "an event was missed or applied twice"
    assert verify(store, counter).equal

"""Real `ledgerflow worker` processes for the drills: starting one, killing one, and the loop that kills
workers at random moments and starts them again under the same or another name; and whether a `ledgerflow
projector` process of a drill has started its loop."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from eventstore import EventStore
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: The drills' processes stop in 2 s, not the default 10 (LEDGERFLOW_WORKER_SHUTDOWN_GRACE): a teardown
#: stops several, and what a node still runs after the grace is handed back all the same.
DRILL_SHUTDOWN_GRACE = "2"


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
        "LEDGERFLOW_WORKER_SHUTDOWN_GRACE": DRILL_SHUTDOWN_GRACE,
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


def projector_running(log: Path, process: subprocess.Popen[bytes]) -> bool:
    """Whether a `ledgerflow projector` process logging JSON lines to `log` has started its loop, its
    SIGTERM handler in place: one still importing when a drill's closing SIGTERM comes dies of the signal
    (-15) instead of stopping cleanly, as a slow host showed."""
    marker = f":{process.pid}:"
    return any(
        '"projector_worker_started"' in line and marker in line
        for line in log.read_text(errors="replace").splitlines()
    )


def kill(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL, and wait until the process is gone."""
    worker.send_signal(signal.SIGKILL)
    worker.wait()


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


def sigkill_at_random_moments(
    store: EventStore,
    start: Callable[[str], subprocess.Popen[bytes]],
    done: Callable[[], bool],
    *,
    prefix: str,
    rng: random.Random,
    most: int,
    pause: float,
) -> int:
    """Runs a worker (`start(name)`) until `done()`, killing it with SIGKILL up to `most` times, each time
    while it works: once it holds a node, after a random extra moment of up to `pause` seconds. After a
    kill the next worker starts at once: every other time under the first name, `{prefix}-a` (it takes
    its nodes back at once), else under a new one (it must wait for the leases to lapse). Then waits for
    `done()` and stops the last worker with SIGTERM. Returns the number of kills."""
    kills = 0
    name, since = f"{prefix}-a", db_now(store)
    worker = start(name)
    try:
        while not done() and kills < most:

            def claimed(n: str = name, t: datetime = since) -> bool:
                return holds_nodes(store, n, t) or done()

            wait_until(claimed, timeout=60, what="the worker to claim a node")
            threading.Event().wait(rng.uniform(0, pause))
            kill(worker)
            kills += 1
            name, since = (f"{prefix}-a" if kills % 2 else f"{prefix}-{kills}"), db_now(store)
            worker = start(name)
        wait_until(done, timeout=120, what="every run to finish")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    return kills

"""Versions of a definition, on real worker processes: a run goes on only with the version it started with.

Worker A has versions 1 and 2 of `versioned`, worker B only version 2. Runs started with version 1 are
never run by B, not even after A is SIGKILLed in the middle of them: they wait (and `doctor` says which
version they wait for) until a worker that has version 1 comes back, then each completes exactly once.
Node bodies note (run, version, process) in a file per process: one O_APPEND write per line, nothing
lost to a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventstore import EventStore
from ops.doctor import diagnose
from tests.acceptance.drill_workers import DRILL_SHUTDOWN_GRACE
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry, versions_without_worker
from workflows import events as ev

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.drill
_NEVER = threading.Event()


def note(ctx: NodeContext, version: str) -> None:
    directory = os.environ["VERSIONS_NOTES"]
    fd = os.open(os.path.join(directory, f"{os.getpid()}.notes"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{ctx.run_id} {version} {ctx.node}\n".encode())
    finally:
        os.close(fd)


def _define(version: str) -> Workflow:
    wf = Workflow("versioned", version=version)

    @wf.node()
    def work(ctx: NodeContext) -> str:
        note(ctx, version)
        gate = Path(os.environ["VERSIONS_GATE"])
        while version == "1" and not gate.exists():
            _NEVER.wait(0.05)  # a long node: runs until the test opens the gate
        return version

    @wf.node(depends_on=["work"])
    def finish(ctx: NodeContext) -> str:
        note(ctx, version)
        return str(ctx.outputs["work"])

    return wf


v1, v2 = _define("1"), _define("2")
both = WorkflowRegistry()
both.register(v1)
both.register(v2)
only_v2 = WorkflowRegistry()
only_v2.register(v2)
only_v1 = WorkflowRegistry()
only_v1.register(v1)


class Workers:
    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.notes = tmp_path / "notes"
        self.notes.mkdir()
        self.gate = tmp_path / "gate"
        self.log = tmp_path / "workers.log"
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, registry: str) -> subprocess.Popen[bytes]:
        env = os.environ | {
            "LEDGERFLOW_DATABASE_URL": self.url,
            "LEDGERFLOW_WORKFLOWS": f"tests.acceptance.test_versions_drill:{registry}",
            "LEDGERFLOW_WORKFLOW_LEASE_TTL": "10",
            "LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL": "2.5",
            "LEDGERFLOW_WORKER_CONCURRENCY": "16",
            "LEDGERFLOW_LOG_FORMAT": "json",
            "LEDGERFLOW_WORKER_SHUTDOWN_GRACE": DRILL_SHUTDOWN_GRACE,
            "VERSIONS_NOTES": str(self.notes),
            "VERSIONS_GATE": str(self.gate),
        }
        with self.log.open("ab") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "worker", "--name", name],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append(p)
        return p

    def noted(self, p: subprocess.Popen[bytes]) -> list[tuple[str, str, str]]:
        """(run id, version, node) of every node body entered in process `p`."""
        path = self.notes / f"{p.pid}.notes"
        if not path.exists():
            return []
        return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]

    def stop_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.started:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def workers(store: EventStore, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(store.url, tmp_path)
    yield w
    w.stop_all()


def present(store: EventStore, count: int) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.wf_worker_presence() WHERE alive").fetchone()
    return row == (count,)


def statuses(engine: Engine, runs: list[uuid.UUID]) -> dict[str, int]:
    found: dict[str, int] = {}
    for run in engine.load_many(runs).values():
        found[run.status] = found.get(run.status, 0) + 1
    return found


def count_events(store: EventStore, run_id: uuid.UUID, type_: str) -> int:
    return sum(1 for e in store.read_stream(ev.run_stream(run_id), limit=10_000) if e.type == type_)


def test_a_run_goes_on_only_with_the_version_it_started_with(store: EventStore, workers: Workers) -> None:
    a = workers.start("a-both", "both")
    b = workers.start("b-only-v2", "only_v2")
    wait_until(lambda: present(store, 2), timeout=60, what="both workers present")

    old = [Engine(store, only_v1).start("versioned").run_id for _ in range(6)]
    new = [Engine(store, both).start("versioned").run_id for _ in range(6)]
    assert {Engine(store, both).load(r).workflow_version for r in new} == {"2"}  # the newest

    # A holds every version-1 run in its first node; B finishes every version-2 run it can get.
    wait_until(lambda: {r for r, v, _ in workers.noted(a) if v == "1"} == {str(r) for r in old}, timeout=60)
    engine = Engine(store, both)
    wait_until(lambda: statuses(engine, new) == {"succeeded": 6}, timeout=60, what="version-2 runs done")

    # SIGKILL A mid-node: B takes the nodes back (A's presence is gone) but leaves them to a worker
    # with version 1; they wait, visibly.
    a.send_signal(signal.SIGKILL)
    a.wait()

    def waiting_rows() -> bool:
        with store.pool.connection() as conn:
            unserved = versions_without_worker(conn)
        return [(w.workflow, w.version, w.runs) for w in unserved] == [("versioned", "1", 6)]

    wait_until(waiting_rows, timeout=60, what="version-1 runs waiting for a worker that has version 1")
    assert any(
        f.check == "workflow versioned version 1" and f.level == "warn" and "6 run(s)" in f.detail
        for f in diagnose(store, [])
    )
    # B is alive and claiming (a fresh version-2 run completes), and still leaves version 1 alone.
    late = Engine(store, both).start("versioned").run_id
    wait_until(lambda: statuses(engine, [late]) == {"succeeded": 1}, timeout=60)
    assert statuses(engine, old) == {"running": 6}
    assert {v for _, v, _ in workers.noted(b)} == {"2"}

    # A worker with version 1 comes back: each version-1 run completes exactly once, with version 1.
    workers.gate.touch()
    c = workers.start("c-both", "both")
    wait_until(lambda: statuses(engine, old) == {"succeeded": 6}, timeout=90, what="version-1 runs done")
    for run_id in old:
        run = engine.load(run_id)
        assert run.workflow_version == "1"
        assert run.nodes["finish"].output == "1"
        assert count_events(store, run_id, ev.NODE_SUCCEEDED) == 2
        assert count_events(store, run_id, ev.RUN_COMPLETED) == 1
    assert {v for _, v, _ in workers.noted(b)} == {"2"}
    assert {(r, n) for r, v, n in workers.noted(c) if v == "1"} >= {(str(r), "finish") for r in old}
    with store.pool.connection() as conn:
        assert versions_without_worker(conn) == []

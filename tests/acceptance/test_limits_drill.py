"""A limit of 4 held exactly across three real `ledgerflow worker` processes, also through a SIGKILL.

Each run is `prepare` -> `call` -> `finish`, and only `call` needs a slot of the limit `llm`
(concurrency 4): its slot is claimed by the claim query or handed over at `prepare`'s end, so both ways
in are exercised. Every execution of `call`'s body notes its start and end in a side table this test
owns (its own transaction, so a SIGKILL loses nothing noted), and the overlap of those intervals is the
number of calls running at once. Twelve node threads (three workers of four) could run twelve.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from eventstore import EventStore
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry
from workflows import events as ev

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.drill

LIMIT = 4
CALL_SECONDS = 0.4
RUNS = 36

registry = WorkflowRegistry()
registry.limit("llm", concurrency=LIMIT)
limited = Workflow("limited")


def _note(sql: str, *params: object) -> None:
    with psycopg.connect(os.environ["LEDGERFLOW_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(sql, params)  # type: ignore[arg-type]


@limited.node()
def prepare(ctx: NodeContext) -> int:
    return int(ctx.input["n"])


@limited.node(depends_on=["prepare"], limits=["llm"])
def call(ctx: NodeContext) -> int:
    execution = uuid.uuid4()
    _note(
        "INSERT INTO public.limit_probe (execution, run_id, attempt, pid) VALUES (%s, %s, %s, %s)",
        execution,
        ctx.run_id,
        ctx.attempt,
        os.getpid(),
    )

    def llm() -> int:
        _note("INSERT INTO public.limit_calls (run_id) VALUES (%s)", ctx.run_id)
        threading.Event().wait(CALL_SECONDS)  # the provider's answer takes this long
        return int(ctx.outputs["prepare"]) * 2

    answer = ctx.step("llm", llm)
    _note("UPDATE public.limit_probe SET ended_at = clock_timestamp() WHERE execution = %s", execution)
    return answer


@limited.node(depends_on=["call"])
def finish(ctx: NodeContext) -> int:
    return int(ctx.outputs["call"]) + 1


registry.register(limited)


def start_worker(url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "tests.acceptance.test_limits_drill:registry",
        "LEDGERFLOW_WORKFLOW_LEASE_TTL": "3",
        "LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL": "0.75",
        "LEDGERFLOW_RECOVERY_INTERVAL": "0.5",
        "LEDGERFLOW_WORKER_CONCURRENCY": "4",
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "worker", "--name", name],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end at the instant of a start does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_limit_of_four_holds_across_three_workers_and_a_sigkill(store: EventStore, tmp_path: Path) -> None:
    with store.pool.connection() as conn:
        conn.execute(
            "CREATE TABLE public.limit_probe (execution uuid PRIMARY KEY, run_id uuid, attempt int, pid int, "
            "started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)"
        )
        conn.execute(
            "CREATE TABLE public.limit_calls (run_id uuid, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    engine = Engine(store, registry)
    log = tmp_path / "workers.log"
    workers = [start_worker(store.url, f"limits-{i}", log) for i in range(3)]
    killed_at: datetime | None = None
    victim = workers[0]
    try:
        run_ids = [engine.start("limited", input={"n": n}).run_id for n in range(RUNS)]

        def running_now() -> list[int]:
            with store.pool.connection() as conn:
                rows = conn.execute("SELECT pid FROM public.limit_probe WHERE ended_at IS NULL").fetchall()
            return [r[0] for r in rows]

        # Saturated, with the victim holding slots: then it dies, holding them.
        wait_until(
            lambda: len(running_now()) == LIMIT and victim.pid in running_now(),
            timeout=60,
            what="the limit to be saturated with the first worker holding a slot",
        )
        with store.pool.connection() as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert row is not None
        killed_at = row[0]

        def all_done() -> bool:
            return all(not engine.load(r).active for r in run_ids)

        wait_until(all_done, timeout=120, what="every run to finish")
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)

    with store.pool.connection() as conn:
        probes = conn.execute("SELECT run_id, pid, started_at, ended_at FROM public.limit_probe").fetchall()
        calls = conn.execute("SELECT run_id, at FROM public.limit_calls").fetchall()
        in_use = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_queue WHERE status = 'claimed'"
        ).fetchone()
    assert killed_at is not None
    dead = [p for p in probes if p[1] == victim.pid and p[3] is None]
    assert dead, "the SIGKILL interrupted no call"
    # A killed call ended with its process.
    intervals = [(started, ended if ended is not None else killed_at) for _, _, started, ended in probes]
    held = max_overlap(intervals)
    print(f"\nlimit {LIMIT}: at most {held} calls at once over {len(probes)} executions of {RUNS} runs")
    assert held == LIMIT, f"{held} calls ran at once under a limit of {LIMIT}"
    assert in_use == (0,)

    for run_id in run_ids:
        events = store.read_stream(ev.run_stream(run_id), limit=10_000)
        assert sum(e.type == ev.RUN_COMPLETED for e in events) == 1
        assert engine.load(run_id).node("finish").output == engine.load(run_id).input["n"] * 2 + 1
        recorded = [e.recorded_at for e in events if e.type == ev.STEP_RECORDED]
        assert len(recorded) == 1
        # No call of the memoized step began after its answer was recorded.
        assert all(at < recorded[0] for r, at in calls if r == run_id), f"run {run_id} paid twice"
    # The killed worker's calls were taken over: their slots came back, and their runs completed.
    taken_over = {p[0] for p in dead}
    for run_id in taken_over:
        events = store.read_stream(ev.run_stream(run_id), limit=10_000)
        assert any(e.type == ev.NODE_RECLAIMED and e.data["node"] == "call" for e in events)

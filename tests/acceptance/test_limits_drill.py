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
import threading
import uuid
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from eventstore import EventStore
from tests.acceptance.drill_workers import start_worker as drill_worker
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry
from workflows import events as ev

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
        # The provider's answer takes this long (longer in the worker the drill kills, so that it dies
        # in the middle of its calls).
        threading.Event().wait(float(os.environ.get("LIMITS_CALL_SECONDS", CALL_SECONDS)))
        return int(ctx.outputs["prepare"]) * 2

    answer = ctx.step("llm", llm)
    _note("UPDATE public.limit_probe SET ended_at = clock_timestamp() WHERE execution = %s", execution)
    return answer


@limited.node(depends_on=["call"])
def finish(ctx: NodeContext) -> int:
    return int(ctx.outputs["call"]) + 1


registry.register(limited)

registry.limit("quota", per_minute=5)
quota = Workflow("quota")


@quota.node(limits=["quota"])
def ask(ctx: NodeContext) -> int:
    _note(
        "INSERT INTO public.limit_probe (execution, run_id, attempt, pid, ended_at) "
        "VALUES (%s, %s, %s, %s, clock_timestamp())",
        uuid.uuid4(),
        ctx.run_id,
        ctx.attempt,
        os.getpid(),
    )
    return 1


registry.register(quota)


def start_worker(
    url: str, name: str, log: Path, call_seconds: float = CALL_SECONDS
) -> subprocess.Popen[bytes]:
    return drill_worker(
        url,
        name,
        log,
        lease_ttl=3,
        workflows="tests.acceptance.test_limits_drill:registry",
        env={"LIMITS_CALL_SECONDS": str(call_seconds)},
    )


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end at the instant of a start does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def create_probe(store: EventStore) -> None:
    with store.pool.connection() as conn:
        conn.execute(
            "CREATE TABLE public.limit_probe (execution uuid PRIMARY KEY, run_id uuid, attempt int, pid int, "
            "started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)"
        )


def test_a_per_minute_limit_holds_across_workers(store: EventStore, tmp_path: Path) -> None:
    """Five starts a minute: with two workers and eight runs, five start and three wait, due when the
    oldest start is a minute old. The minute then passes at once (the starts are moved back in time)."""
    create_probe(store)
    engine = Engine(store, registry)
    log = tmp_path / "workers.log"
    workers = [start_worker(store.url, f"quota-{i}", log) for i in range(2)]
    try:
        run_ids = [engine.start("quota", input={"n": n}).run_id for n in range(8)]

        def deferred() -> bool:
            with store.pool.connection() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM ledgerflow.workflow_queue "
                    "WHERE status = 'ready' AND ready_at > clock_timestamp() + interval '50 seconds'"
                ).fetchone()
                started = conn.execute("SELECT count(*) FROM public.limit_probe").fetchone()
            return row == (3,) and started == (5,)  # admitted nodes note their start a moment later

        wait_until(deferred, timeout=60, what="three runs to wait for the minute to have room")
        with store.pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM public.limit_probe").fetchone() == (5,)
            conn.execute(
                "UPDATE ledgerflow.workflow_limit_starts SET started_at = started_at - interval '61 seconds'"
            )
            conn.execute(
                "UPDATE ledgerflow.workflow_queue SET ready_at = clock_timestamp() WHERE status = 'ready'"
            )
        wait_until(lambda: all(not engine.load(r).active for r in run_ids), timeout=60, what="every run")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)
    with store.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM public.limit_probe").fetchone() == (8,)


def test_a_limit_of_four_holds_across_three_workers_and_a_sigkill(store: EventStore, tmp_path: Path) -> None:
    create_probe(store)
    with store.pool.connection() as conn:
        conn.execute(
            "CREATE TABLE public.limit_calls (run_id uuid, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    engine = Engine(store, registry)
    log = tmp_path / "workers.log"
    workers = [start_worker(store.url, f"limits-{i}", log, 30 if i == 0 else CALL_SECONDS) for i in range(3)]
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

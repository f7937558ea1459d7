"""Workflows that wait, measured as a user runs them: durable timers and signals on a real worker process.

Run by hand (it is not a test):

    python bench/waiting.py [--runs 3] [--sleepers 1000] [--spread 10] [--signals 1000] [--senders 8]

Each run makes a fresh database and starts one `ledgerflow worker` process (concurrency 4: four node
threads).

- timers: SLEEPERS runs each sleep in their one node, for 10 s plus a share of SPREAD seconds (so that
  all of them sleep at once, and their due times are spread evenly), then record when they woke. Lateness
  is the time from the due time the log recorded to the node body's return from `ctx.sleep`, the moment
  the user's code goes on. The baseline, in the same run, is a bare Python loop sleeping until the same
  due times in one thread (`time.sleep`): what a process that cannot crash would achieve, so the figure is
  what durability costs. The worker's thread count is sampled throughout (the most seen is reported).
- signals: SIGNALS runs each wait for a signal; once all of them wait, SENDERS client threads send one
  signal to each (`Engine.signal`), and the delivery rate is SIGNALS divided by the time from the first
  send to the last run's completion. The baseline, in the same run, is raw psycopg: the same number of
  INSERTs of a comparable row into a twin table, one transaction each, from as many threads.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    default_admin_url,
    fmt_ratio,
    fresh_database,
    median,
    print_table,
    process_shape,
    quiet_logs,
)
from eventstore import DatabaseSettings, EventStore, open_store
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry

ROOT = Path(__file__).resolve().parents[1]

registry = WorkflowRegistry()
nap = Workflow("bench_nap")


@nap.node()
def sleep_until_due(ctx: NodeContext) -> dict[str, float]:
    ctx.sleep(ctx.input["seconds"])
    return {"woke": time.time()}


approval = Workflow("bench_approval")


@approval.node()
def wait_for_approval(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("approve")


registry.register(nap)
registry.register(approval)


@contextmanager
def worker_process(url: str) -> Iterator[subprocess.Popen[bytes]]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "bench.waiting:registry",
        "LEDGERFLOW_WORKER_CONCURRENCY": "4",
        "LEDGERFLOW_LOG_LEVEL": "warning",
    }
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below, after the process ends
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "worker", "--name", "bench"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    except Exception:
        log.seek(0)
        sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _count(store: EventStore, sql: str) -> int:
    with store.pool.connection() as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.02)


_WAITING = "SELECT count(*) FROM ledgerflow.workflow_queue WHERE status = 'ready' AND ready_at > now()"
_QUEUED = "SELECT count(*) FROM ledgerflow.workflow_queue"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def measure_timers(url: str, sleepers: int, spread: float) -> dict[str, float]:
    store = open_store(DatabaseSettings(database_url=url))
    try:
        engine = Engine(store, registry)
        offsets = [10 + spread * i / sleepers for i in range(sleepers)]
        threads = 0
        with worker_process(url) as proc:
            run_ids = [engine.start("bench_nap", input={"seconds": o}).run_id for o in offsets]

            def finished() -> bool:
                nonlocal threads
                threads = max(threads, process_shape(proc.pid)[0])
                return _count(store, _QUEUED) == 0

            _wait_for(finished, spread + 120, "every run to wake and finish")
        late = []
        for run_id in run_ids:
            node = engine.load(run_id).nodes["sleep_until_due"]
            due = node.waits["sleep#1"]
            assert due is not None
            late.append(node.output["woke"] - due.timestamp())
    finally:
        store.close()
    base = _baseline_sleeps(offsets)
    return {
        "p50": percentile(late, 0.5),
        "p99": percentile(late, 0.99),
        "max": max(late),
        "base_p50": percentile(base, 0.5),
        "base_p99": percentile(base, 0.99),
        "threads": float(threads),
    }


def _baseline_sleeps(offsets: list[float]) -> list[float]:
    """One thread sleeping until each due time in turn (the same schedule, from now): its lateness."""
    start = time.time() - offsets[0] + 0.5
    late = []
    for offset in offsets:
        at = start + offset
        time.sleep(max(0.0, at - time.time()))
        late.append(time.time() - at)
    return late


def measure_signals(url: str, signals: int, senders: int) -> dict[str, float]:
    store = open_store(DatabaseSettings(database_url=url))
    try:
        engine = Engine(store, registry)
        with worker_process(url):
            run_ids = [engine.start("bench_approval").run_id for _ in range(signals)]
            _wait_for(lambda: _count(store, _WAITING) >= signals, 120, "every run to wait")
            started = time.perf_counter()
            with ThreadPoolExecutor(senders) as pool:
                list(pool.map(lambda r: engine.signal(r, "approve", {"ok": True}), run_ids))
            sent = time.perf_counter() - started
            _wait_for(lambda: _count(store, _QUEUED) == 0, 120, "every run to take its signal")
            delivered = time.perf_counter() - started
    finally:
        store.close()
    return {
        "sent": signals / sent,
        "delivered": signals / delivered,
        "raw": _raw_inserts(url, signals, senders),
    }


def _raw_inserts(url: str, count: int, senders: int) -> float:
    """Raw psycopg: `count` one-row transactions from `senders` threads into a twin table: rows/s."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE raw_signals (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id uuid, "
            "name text, payload jsonb, at timestamptz DEFAULT clock_timestamp())"
        )
    local = threading.local()

    def insert(_: int) -> None:
        if not hasattr(local, "conn"):
            local.conn = psycopg.connect(url, autocommit=True)
        local.conn.execute(
            "INSERT INTO raw_signals (run_id, name, payload) VALUES (gen_random_uuid(), 'approve', %s)",
            ('{"ok": true}',),
        )

    started = time.perf_counter()
    with ThreadPoolExecutor(senders) as pool:
        list(pool.map(insert, range(count)))
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sleepers", type=int, default=1000)
    parser.add_argument("--spread", type=float, default=10.0)
    parser.add_argument("--signals", type=int, default=1000)
    parser.add_argument("--senders", type=int, default=8)
    args = parser.parse_args()
    quiet_logs()
    admin = default_admin_url()
    timers, signals = [], []
    for i in range(args.runs):
        with fresh_database(admin, "bench_timers") as url:
            timers.append(measure_timers(url, args.sleepers, args.spread))
        with fresh_database(admin, "bench_signals") as url:
            signals.append(measure_signals(url, args.signals, args.senders))
        print(f"run {i + 1}/{args.runs}: timers {timers[-1]}, signals {signals[-1]}", file=sys.stderr)

    def ms(key: str) -> str:
        return f"{median([t[key] for t in timers]) * 1000:.0f} ms"

    print(f"\nTimers: {args.sleepers} sleeping runs, due times spread over {args.spread:g} s, one worker")
    print_table(
        ["measure", "ledgerflow", "time.sleep loop", "ratio"],
        [
            ["lateness p50", ms("p50"), ms("base_p50"), ""],
            ["lateness p99", ms("p99"), ms("base_p99"), ""],
            ["lateness max", ms("max"), "", ""],
            ["worker threads (most seen)", f"{median([t['threads'] for t in timers]):.0f}", "", ""],
        ],
    )
    print(f"\nSignals: {args.signals} waiting runs, {args.senders} sending threads")
    print_table(
        ["measure", "ledgerflow /s", "raw INSERT /s", "ledgerflow ÷ raw"],
        [
            [
                "sent (acknowledged)",
                f"{median([s['sent'] for s in signals]):.0f}",
                f"{median([s['raw'] for s in signals]):.0f}",
                fmt_ratio([s["sent"] / s["raw"] for s in signals]),
            ],
            ["delivered (run completed)", f"{median([s['delivered'] for s in signals]):.0f}", "", ""],
        ],
    )


if __name__ == "__main__":
    main()

"""How soon an event appended to the log starts the run its trigger names, as a user runs it.

Run by hand (it is not a test):

    python -m bench.triggers [--runs 3] [--events 200] [--gap 0.05]

Each run makes a fresh database and starts one real `ledgerflow worker` process whose registry has a
workflow triggered by `Ordered` events (`bench.triggers:registry`). It then appends EVENTS events, one
every GAP seconds, so that each is delivered on its own rather than in a backlog. A subscription in this
process follows the log and notes when it sees each appended event and the RunStarted its trigger made.
Figures, in milliseconds from the append's return, p50 and p99 of each run, then the median over runs:

- **event seen**: the subscription reads the appended event (the baseline: how soon any reader of the
  log can know of it, through the same wake-up and read);
- **run started**: it reads the RunStarted that names the event (`triggered_by`).

The ratio run started / event seen says what the trigger adds to the log's own wake-up: a second
wake-up (the worker's consumer), the start in the cursor's transaction, and the commit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import default_admin_url, fresh_database, median, print_table, quiet_logs
from eventstore import EventStore, NewEvent, open_store
from workflows import NodeContext, Trigger, Workflow, WorkflowRegistry

ROOT = Path(__file__).resolve().parents[1]

registry = WorkflowRegistry()
on_ordered = Workflow("on_ordered", triggers=[Trigger("Ordered", category="order")])


@on_ordered.node()
def accept(ctx: NodeContext) -> Any:
    return {"event_id": ctx.input["event_id"]}


registry.register(on_ordered)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def start_worker(url: str) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "bench.triggers:registry",
        "LEDGERFLOW_LOG_LEVEL": "warning",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "worker", "--name", "bench"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def warm_up(store: EventStore, seen: dict[str, float], timeout: float = 60.0) -> None:
    """One event whose run must start: the worker is up and its trigger's consumer holds its lease."""
    store.append("order-warmup", [NewEvent("Ordered", {})])
    event_id = str(store.read_stream("order-warmup", limit=1)[0].event_id)
    deadline = time.monotonic() + timeout
    while f"run:{event_id}" not in seen:
        if time.monotonic() > deadline:
            raise TimeoutError("the worker never started the warm-up run")
        time.sleep(0.01)


def one_run(admin_url: str, events: int, gap: float) -> tuple[list[float], list[float]]:
    with fresh_database(admin_url, "bench_triggers") as url, open_store(url=url, migrate=True) as store:
        seen: dict[str, float] = {}  # "event:<id>" / "run:<event id>" -> when the subscription read it
        subscription = store.subscribe(types=["Ordered", "wf.RunStarted"], batch_size=100)

        def follow() -> None:
            for e in subscription:
                now = time.perf_counter()
                if e.type == "Ordered":
                    seen.setdefault(f"event:{e.event_id}", now)
                elif e.data.get("triggered_by"):
                    seen.setdefault(f"run:{e.data['triggered_by']['event_id']}", now)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        worker = start_worker(url)
        try:
            warm_up(store, seen)
            appended: list[tuple[str, float]] = []
            for i in range(events):
                store.append(f"order-{i}", [NewEvent("Ordered", {"i": i})])
                at = time.perf_counter()
                appended.append((str(store.read_stream(f"order-{i}", limit=1)[0].event_id), at))
                time.sleep(gap)  # pacing: one event at a time, not a backlog
            deadline = time.monotonic() + 60
            while not all(f"run:{e}" in seen for e, _ in appended):
                if time.monotonic() > deadline:
                    raise TimeoutError("not every run started within 60 s")
                time.sleep(0.01)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            subscription.stop()
        event_ms = [(seen[f"event:{e}"] - at) * 1000 for e, at in appended]
        run_ms = [(seen[f"run:{e}"] - at) * 1000 for e, at in appended]
        return event_ms, run_ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between appends")
    args = parser.parse_args()
    quiet_logs()
    results = []
    for n in range(args.runs):
        event_ms, run_ms = one_run(default_admin_url(), args.events, args.gap)
        row = {
            "event p50": percentile(event_ms, 50),
            "event p99": percentile(event_ms, 99),
            "run p50": percentile(run_ms, 50),
            "run p99": percentile(run_ms, 99),
        }
        results.append(row)
        print(f"run {n + 1}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()), flush=True)
    rows = [
        [
            what,
            f"{median([r[f'event {what}'] for r in results]):.1f}",
            f"{median([r[f'run {what}'] for r in results]):.1f}",
            f"{median([r[f'run {what}'] / r[f'event {what}'] for r in results]):.1f}x",
        ]
        for what in ("p50", "p99")
    ]
    print()
    print(f"medians of {args.runs} runs, {args.events} events each, one every {args.gap} s (milliseconds):")
    print_table(["", "event seen", "run started", "run / event"], rows)


if __name__ == "__main__":
    main()

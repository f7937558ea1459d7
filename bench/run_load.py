"""How long loading a run takes as its history grows: a run of 100 events against one of 100,000.

Run by hand (it is not a test):

    python bench/run_load.py [--small 100] [--large 100000] [--loads 30]

In a fresh database, two runs are written straight to the log (RunStarted, NodesReady, then NodeProgress
events of one node, plus one SignalReceived of 64 KB every 100 events, as a busy, signalled run would
have). The `workflow_tables` projection then catches up on them, as `ledgerflow projector` would (timed:
it is what keeping the runs' tables and snapshots costs, off any request's path), keeping each run's
snapshot within `LEDGERFLOW_RUN_SNAPSHOT_EVERY` events of its end. Each run is then loaded once (its first
load: the snapshot and the events after it), then `--loads` more times; the median of those is the
figure, and the ratios large/small, of first loads and of medians, are the result (target: about 1).
With `--no-projector` the projection does not run: a first load then folds what no snapshot covers (the
run's whole history) and writes one, as when the projector is stopped.

Results go to bench/results/run_load-<UTC time>.json with the commit, the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import default_admin_url, fresh_database, load_average, median, print_table, quiet_logs
from eventstore import ANY, DatabaseSettings, EventStore, NewEvent, open_store
from projector import ProjectorWorker, WorkerSettings
from workflows import Engine, RunCaps, WorkflowRegistry, workflow_tables
from workflows import events as ev
from workflows import new_events as new

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 10_000  # events per append: the store's default cap on one append


def write_run(store: EventStore, events: int) -> uuid.UUID:
    run_id = uuid.uuid4()
    stream = ev.run_stream(run_id)
    head = [
        new.run_started(
            run_id=run_id,
            workflow="bench",
            version="1",
            key=None,
            input={"n": 1},
            input_fingerprint="fp",
            nodes=["work"],
            fingerprints={"work": "f"},
        ),
        new.nodes_ready(run_id=run_id, nodes=["work"]),
    ]

    def one(i: int) -> NewEvent:
        if i % 100 == 99:
            return new.signal_received(
                run_id=run_id, name="note", payload={"i": i, "pad": "s" * 65_000}, actor=None
            )
        return new.node_progress(run_id=run_id, node="work", current=i, total=events, message="")

    body = [one(i) for i in range(events - len(head))]
    batch: list[NewEvent] = head
    for e in body:
        batch.append(e)
        if len(batch) == CHUNK:
            store.append(stream, batch, expected_version=ANY)
            batch = []
    if batch:
        store.append(stream, batch, expected_version=ANY)
    return run_id


def project(store: EventStore) -> None:
    """Run the `workflow_tables` projection until it has applied everything in the log."""
    worker = ProjectorWorker(store, [workflow_tables], WorkerSettings())
    try:
        worker.run_until_caught_up(timeout=3600)
    finally:
        worker.release_all()


def timed(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def commit() -> str:
    try:
        git = ["git", "rev-parse", "HEAD"]
        out = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=30)
    parser.add_argument("--no-projector", action="store_true", help="load runs the projection has not read")
    args = parser.parse_args()
    quiet_logs()
    load_before = load_average()
    figures: dict[str, dict[str, float]] = {}
    with fresh_database(default_admin_url(), "bench_runload") as url:
        store = open_store(DatabaseSettings(database_url=url, max_event_bytes=1024 * 1024))
        try:
            engine = Engine(store, WorkflowRegistry())
            for label, size in (("small", args.small), ("large", args.large)):
                began = time.perf_counter()
                run_id = write_run(store, size)
                written = time.perf_counter() - began
                projected = 0.0
                if not args.no_projector:
                    projected = timed(lambda: project(store))
                first = timed(lambda r=run_id: engine.load(r))
                times = [timed(lambda r=run_id: engine.load(r)) for _ in range(args.loads)]
                assert engine.load(run_id).version == size
                figures[label] = {
                    "events": size,
                    "write_s": written,
                    "project_s": projected,
                    "first_load_ms": first * 1000,
                    "median_load_ms": median(times) * 1000,
                    "max_load_ms": max(times) * 1000,
                }
        finally:
            store.close()
    ratio = figures["large"]["median_load_ms"] / figures["small"]["median_load_ms"]
    first_ratio = figures["large"]["first_load_ms"] / figures["small"]["first_load_ms"]
    print_table(
        ["run", "events", "projected in (s)", "first load (ms)", "median load (ms)", "max load (ms)"],
        [
            [
                label,
                f"{f['events']:,.0f}",
                "-" if args.no_projector else f"{f['project_s']:.1f}",
                f"{f['first_load_ms']:.1f}",
                f"{f['median_load_ms']:.2f}",
                f"{f['max_load_ms']:.2f}",
            ]
            for label, f in figures.items()
        ],
    )
    print(f"\nratio large/small: first loads {first_ratio:.2f}, median loads {ratio:.2f}")
    result = {
        "benchmark": "run_load",
        "at": datetime.now(UTC).isoformat(),
        "commit": commit(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "load_average": {"before": load_before, "after": load_average()},
        "loads": args.loads,
        "projector": not args.no_projector,
        "snapshot_every": RunCaps().run_snapshot_every,
        "runs": figures,
        "ratio_large_to_small": ratio,
        "first_load_ratio_large_to_small": first_ratio,
    }
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"run_load-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"saved {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

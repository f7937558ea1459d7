"""Catch-up of one partitioned projection by 1, 2 and 4 projector worker processes.

Run by hand (it is not a test):

    python bench/partitioned_catchup.py [--events 1000000] [--streams 2000] [--rounds 3] [--python-us 0]

`--events` events over `--streams` streams are bulk-loaded (EventStore.import_events) into a fresh database.
Then, in each round, in an order that alternates between rounds, a fresh projection catches up from zero:

* `unpartitioned, 1 process`: the projection with partitions=1, as before partitioned projections;
* `4 segments, K processes` for K in 1, 2, 4: the same projection with partitions=4, applied by K
  `ProjectorWorker` processes (each process one worker, as `ledgerflow projector` runs), which spread the
  segments over themselves by their lease share.

The projection counts events per stream with one upsert per batch (`on_batch`), and with `--python-us`
spends that many microseconds of pure Python per event besides (a handler that computes before it
writes), which makes the projection's own Python the bound. The clock runs from spawning the processes
to every segment's cursor reaching the end of the log (polled every 20 ms), so it includes the processes'
start (about the same for every K). Printed: the median time and rate of each configuration, its ratio
to `4 segments, 1 process` (median of per-round ratios), and where the CPU went: the worker processes'
CPU seconds, the database's (its backends serving the benchmark's database) and the machine's busy
seconds, per second of wall time. On a 2-core machine two processes can at best double the rate when
neither the database nor the other process takes a core; the CPU figures say which one did.

Results are saved as JSON in bench/results/ with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    BackendCpu,
    default_admin_url,
    fresh_database,
    load_average,
    machine_cpu_seconds,
    median,
    print_table,
    process_cpu_seconds,
    quiet_logs,
)
from eventstore import DatabaseSettings, EventStore, NewEvent, RecordedEvent, open_store  # noqa: E402
from projector import ApplyContext, Projection, ProjectorWorker, Table, WorkerSettings  # noqa: E402

PARTITIONS = 4


def make_projection(name: str, partitions: int, python_us: float) -> Projection:
    projection = Projection(
        name=name,
        version=1,
        schema=name,
        partitions=partitions,
        tables=[Table("counts", "CREATE TABLE {table} (stream_id text PRIMARY KEY, n bigint NOT NULL)")],
    )
    spin = python_us / 1e6

    @projection.on_batch
    def count(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
        per_stream: dict[str, int] = {}
        for e in events:
            if spin:
                until = time.perf_counter() + spin
                while time.perf_counter() < until:
                    pass
            per_stream[e.stream_id] = per_stream.get(e.stream_id, 0) + 1
        ctx.execute(
            """INSERT INTO {counts} AS c (stream_id, n) SELECT * FROM unnest(%s::text[], %s::bigint[])
               ON CONFLICT (stream_id) DO UPDATE SET n = c.n + excluded.n""",
            (list(per_stream), list(per_stream.values())),
        )

    return projection


def open_bench_store(url: str) -> EventStore:
    return open_store(DatabaseSettings(database_url=url), url=url, migrate=False, name="ledgerflow-bench")


def child(url: str, name: str, partitions: int, python_us: float, batch_size: int) -> None:
    """One worker process: run the projection until SIGTERM."""
    quiet_logs()
    projection = make_projection(name, partitions, python_us)
    with open_bench_store(url) as store:
        worker = ProjectorWorker(store, [projection], WorkerSettings(batch_size=batch_size))
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        worker.run()


def segments_at_end(store: EventStore, name: str, partitions: int, end: tuple[int, int]) -> bool:
    keys = [name] if partitions == 1 else [f"{name}#{k}" for k in range(partitions)]
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT cursor_tx, cursor_position FROM ledgerflow.projection_cursors WHERE projection = ANY(%s)",
            (keys,),
        ).fetchall()
    return len(rows) == len(keys) and all((int(r[0]), int(r[1])) >= end for r in rows)


def catch_up(
    store: EventStore, url: str, name: str, partitions: int, processes: int, args: argparse.Namespace
) -> dict[str, float]:
    projection = make_projection(name, partitions, args.python_us)
    ProjectorWorker(store, [projection]).prepare()
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT transaction_id::text::bigint, position FROM ledgerflow.events "
            "ORDER BY transaction_id DESC, position DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    end = (int(row[0]), int(row[1]))
    cpu = BackendCpu(url)
    server_before = cpu.snapshot()
    machine_before = machine_cpu_seconds()
    started = time.perf_counter()
    command = [sys.executable, __file__, "--child", url, name, str(partitions), str(args.python_us)]
    procs = [
        subprocess.Popen(
            [*command, str(args.batch_size)], cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}
        )
        for _ in range(processes)
    ]
    try:
        deadline = started + args.timeout
        while not segments_at_end(store, name, partitions, end):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{name}: not caught up within {args.timeout}s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{name}: a worker process exited early")
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        workers_cpu = sum(process_cpu_seconds(p.pid) or 0.0 for p in procs)
        server = BackendCpu.used(server_before, cpu.snapshot())
        machine = machine_cpu_seconds() - machine_before
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        cpu.close()
    with store.pool.connection() as conn:
        counted = conn.execute(f'SELECT coalesce(sum(n), 0)::bigint FROM "{name}".counts').fetchone()
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    if counted is None or int(counted[0]) != args.events:
        raise RuntimeError(f"{name}: counted {counted}, expected {args.events}")  # a fast wrong answer
    return {
        "seconds": elapsed,
        "rate": args.events / elapsed,
        "workers_cpu_per_s": workers_cpu / elapsed,
        "server_cpu_per_s": server / elapsed,
        "machine_busy_per_s": machine / elapsed,
    }


CONFIGS: list[tuple[str, int, int]] = [
    ("unpartitioned, 1 process", 1, 1),
    ("4 segments, 1 process", PARTITIONS, 1),
    ("4 segments, 2 processes", PARTITIONS, 2),
    ("4 segments, 4 processes", PARTITIONS, 4),
]
BASELINE = "4 segments, 1 process"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_url, child_name, segments, python_us, batch_size = sys.argv[2:7]
        child(child_url, child_name, int(segments), float(python_us), int(batch_size))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--python-us", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    load_before = load_average()
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in CONFIGS}
    with fresh_database(args.url, "bench_parts") as url:
        open_store(url=url, migrate=True).close()
        with open_bench_store(url) as store:
            began = time.perf_counter()
            store.import_events(
                (f"order-{i % args.streams}", NewEvent("Added", {"i": i})) for i in range(args.events)
            )
            fill = time.perf_counter() - began
            print(f"filled {args.events:,} events over {args.streams:,} streams in {fill:.0f}s", flush=True)
            for r in range(args.rounds):
                order = CONFIGS if r % 2 == 0 else list(reversed(CONFIGS))
                for label, partitions, processes in order:
                    name = f"pc_{r}_{partitions}_{processes}"
                    found = catch_up(store, url, name, partitions, processes, args)
                    results[label].append(found)
                    print(
                        f"round {r + 1} {label}: {found['seconds']:.1f}s, {found['rate']:,.0f} ev/s",
                        flush=True,
                    )
    rows = []
    summary: dict[str, Any] = {}
    for label, _, _ in CONFIGS:
        runs = results[label]
        ratios = [run["rate"] / base["rate"] for run, base in zip(runs, results[BASELINE], strict=True)]
        summary[label] = {
            "runs": runs,
            "median_seconds": median([x["seconds"] for x in runs]),
            "median_rate": median([x["rate"] for x in runs]),
            "ratio_to_one_process": median(ratios),
            "ratios": ratios,
            "median_workers_cpu_per_s": median([x["workers_cpu_per_s"] for x in runs]),
            "median_server_cpu_per_s": median([x["server_cpu_per_s"] for x in runs]),
            "median_machine_busy_per_s": median([x["machine_busy_per_s"] for x in runs]),
        }
        s = summary[label]
        rows.append(
            [
                label,
                f"{s['median_seconds']:.1f}",
                f"{s['median_rate']:,.0f}",
                f"{s['ratio_to_one_process']:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                f"{s['median_workers_cpu_per_s']:.2f}",
                f"{s['median_server_cpu_per_s']:.2f}",
                f"{s['median_machine_busy_per_s']:.2f}",
            ]
        )
    print_table(
        [
            "configuration",
            "s",
            "events/s",
            f"vs {BASELINE}",
            "workers CPU/s",
            "database CPU/s",
            "machine busy/s",
        ],
        rows,
    )
    out = {
        "benchmark": "partitioned_catchup",
        "events": args.events,
        "streams": args.streams,
        "rounds": args.rounds,
        "batch_size": args.batch_size,
        "python_us": args.python_us,
        "fill_seconds": fill,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": load_average(),
        "results": summary,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "bench" / "results" / f"partitioned_catchup-{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"saved {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

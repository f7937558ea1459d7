"""The idle reader's horizon check on a large log: the store's statement against the one it replaced.

Run by hand (it is not a test):

    python -m bench.horizon_check [--events 1000000] [--calls 15] [--rounds 2]

Every idle projector and subscriber asks whether committed events wait beyond the horizon, every 5-50 ms
while a writer of the log runs (`EventStore.events_beyond_horizon`). The statement before 2026-11-28
joined the horizon inside its EXISTS, so the planner could not use it as a bound on the resume-order
index; where the partitions' statistics lag behind their rows (a fresh import, a fast-filling head
partition before autovacuum analyses it), it was planned as a scan of the whole log. The store's
statement reads the newest stamp from the end of the index. The log is filled by a bulk import, one
writer of the log is left open (the horizon stays behind its events), and both statements are timed as
prepared statements, alternating, first with the partitions as the import left them (never analysed),
then after ANALYZE. Results go to bench/results/horizon_check-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench._common import default_admin_url, fresh_database, load_average, median, print_table, quiet_logs
from bench.run_load import commit
from eventstore import DatabaseSettings, NewEvent, open_store
from eventstore.sqlfile import load_queries

ROOT = Path(__file__).resolve().parent.parent

#: The statement the store sent before, kept here as the baseline.
BEFORE = """WITH h AS MATERIALIZED (SELECT ledgerflow.log_horizon() AS xmin)
SELECT EXISTS (SELECT 1 FROM ledgerflow.events, h WHERE transaction_id >= h.xmin)"""
NOW = load_queries("eventstore")["events_beyond_horizon"]


def timed_calls(conn: psycopg.Connection[Any], query: str, calls: int) -> tuple[float, bool]:
    """The median time of `calls` executions in ms, and the answer (which must be True)."""
    times, answer = [], False
    for _ in range(calls):
        began = time.perf_counter()
        row = conn.execute(query, prepare=True).fetchone()
        times.append((time.perf_counter() - began) * 1000)
        answer = bool(row and row[0])
    return median(times), answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    quiet_logs()
    load_before = load_average()
    figures: dict[str, dict[str, list[float]]] = {}
    with fresh_database(default_admin_url(), "bench_horizon") as url:
        store = open_store(DatabaseSettings(database_url=url))
        try:
            began = time.perf_counter()
            store.import_events(
                (f"s-{i // 10}", NewEvent("T", {"i": i, "pad": "x" * 100})) for i in range(args.events)
            )
            print(f"{args.events:,} events imported in {time.perf_counter() - began:.1f} s")
            with (
                psycopg.connect(url, autocommit=True) as conn,
                psycopg.connect(url) as writer,
                writer.transaction(),
            ):
                store.append("open-writer", [NewEvent("T", {})], conn=writer)
                store.append("after-it", [NewEvent("T", {})])
                for stats in ("as imported", "analysed"):
                    if stats == "analysed":
                        conn.execute("ANALYZE ledgerflow.events")
                    got = figures.setdefault(stats, {"before": [], "now": []})
                    for _ in range(args.rounds):
                        for label, query in (("before", BEFORE), ("now", NOW)):
                            ms, answer = timed_calls(conn, query, args.calls)
                            assert answer, "an event waits beyond the open writer"
                            got[label].append(ms)
        finally:
            store.close()
    rows = [
        [
            stats,
            f"{median(f['before']):.2f}",
            f"{median(f['now']):.2f}",
            f"{median(f['before']) / median(f['now']):.0f}x",
        ]
        for stats, f in figures.items()
    ]
    print_table(["partition statistics", "before (ms)", "now (ms)", "before / now"], rows)
    result = {
        "benchmark": "horizon_check",
        "at": datetime.now(UTC).isoformat(),
        "commit": commit(),
        "load_average": {"before": load_before, "after": load_average()},
        "events": args.events,
        "calls_per_round": args.calls,
        "median_ms": {s: {k: median(v) for k, v in f.items()} for s, f in figures.items()},
        "rounds_ms": figures,
    }
    path = ROOT / "bench" / "results" / f"horizon_check-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"saved {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

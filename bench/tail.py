"""How fast `ledgerflow tail` follows the log with and without a filter, as the user runs it.

Run by hand (it is not a test):

    python bench/tail.py [--runs 3] [--events 300000] [--print 30000]

Each run makes a fresh database holding EVENTS events, one in ten of category `order` and type `Placed`,
then starts `ledgerflow tail` (a real process, output through a pipe) with no filter, with
`--category order` and with `--type Placed`, and counts the lines it prints until PRINT of them came,
timed from the first line (the process start is reported apart). The filters run in the database, so a
filtered tail should keep up with an unfiltered one: the ratio filtered / unfiltered is the figure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench._common import default_admin_url, fmt_rate, fmt_ratio, fresh_database, median, print_table
from eventstore import DatabaseSettings, open_store

ROOT = Path(__file__).resolve().parents[1]
FILTERS: dict[str, list[str]] = {
    "no filter": [],
    "--category order": ["--category", "order"],
    "--type Placed": ["--type", "Placed"],
}

FILL = """
INSERT INTO ledgerflow.events (tenant, stream_id, stream_version, event_id, event_type, data)
SELECT 'default', CASE WHEN i %% 10 = 0 THEN 'order-' ELSE 'noise-' END || (i / 100), i, gen_random_uuid(),
       CASE WHEN i %% 10 = 0 THEN 'Placed' ELSE 'Noise' END, jsonb_build_object('i', i)
  FROM generate_series(1, %(events)s) i
"""


def follow(url: str, args: list[str], lines: int) -> tuple[float, float]:
    """(events/s after the first line, seconds until the first line) of one `ledgerflow tail`."""
    env = os.environ | {"LEDGERFLOW_DATABASE_URL": url, "LEDGERFLOW_LOG_LEVEL": "warning"}
    began = time.perf_counter()
    tail = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "tail", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert tail.stdout is not None
    count, first = 0, 0.0
    try:
        for _ in tail.stdout:
            count += 1
            if count == 1:
                first = time.perf_counter()
            if count == lines:
                break
    finally:
        tail.kill()
        tail.wait()
    return (count - 1) / (time.perf_counter() - first), first - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--print", dest="lines", type=int, default=30_000)
    parser.add_argument("--url", default=default_admin_url())
    options = parser.parse_args()

    rates: dict[str, list[float]] = {name: [] for name in FILTERS}
    starts: list[float] = []
    for _ in range(options.runs):
        with fresh_database(options.url, "bench_tail") as url:
            with open_store(DatabaseSettings(database_url=url)) as store, store.pool.connection() as conn:
                conn.execute(FILL, {"events": options.events})
            for name, args in FILTERS.items():
                rate, start = follow(url, args, options.lines)
                rates[name].append(rate)
                starts.append(start)

    baseline = rates["no filter"]
    rows = [
        [name, fmt_rate(median(values)), fmt_ratio([v / b for v, b in zip(values, baseline, strict=True)])]
        for name, values in rates.items()
    ]
    print(f"\n{options.runs} runs, {options.events:,} events, {options.lines:,} printed per tail")
    print_table(["tail", "events/s (median)", "÷ no filter, same run"], rows)
    print(f"process start to the first line: {median(starts):.2f} s (median)")


if __name__ == "__main__":
    main()

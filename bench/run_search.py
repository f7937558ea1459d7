"""Searching runs by tag, a page at a time, against plain SQL on the same tables.

Run by hand (it is not a test):

    python -m bench.run_search [--runs 200000] [--rounds 7] [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database: the run tables of the `workflow_tables` projection (created by a projector), filled
straight with `--runs` runs of two tenants (90% / 10%), five workflows, four statuses, and three tags each:
`team` (10 values: ~9% of a tenant's runs each), `env` (3 values) and `customer` (1,000 values: ~0.1%),
plus their rows in `workflow_run_tags`. Then, in alternating rounds, each search three ways:

  ours      `workflows.search_runs` (a tag's rows in page order, keyset pages through an opaque cursor);
  gin       the other design the tables could have had: the run table's `tags` jsonb with a GIN index
            (jsonb_path_ops), `tags @> {...}` ordered by start time, paged by OFFSET (the index gives no
            order, so every page sorts every match);
  offset    plain SQL on our own tag index, paged by OFFSET instead of keyset.

for the first page and for a page deep in the results (90% of the way: page 324 of 50 runs for a common
tag with 200,000 runs), a common tag (team), a rare one (customer), and a common tag with a status.
Medians of the rounds
(ms) and ratios against ours; JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, LiteralString

from psycopg.rows import dict_row

from bench._common import default_admin_url, fresh_database, quiet_logs
from eventstore import EventStore, open_store
from projector import ProjectorWorker
from workflows import RunFilter, search_runs, workflow_tables

PAGE = 50

_FILL: LiteralString = """
INSERT INTO ledgerflow.workflow_runs (run_id, tenant, workflow, key, status, current_node, nodes_total,
                                      nodes_done, input, error, cancel_requested, created_at, updated_at,
                                      finished_at, workflow_version, triggered_by, tags)
SELECT gen_random_uuid(), CASE WHEN i %% 10 = 0 THEN 'other' ELSE 'acme' END, 'wf' || (i %% 5), NULL,
       (ARRAY['succeeded', 'failed', 'cancelled', 'running'])[1 + (i / 7) %% 4], NULL, 3, 3, 'null'::jsonb,
       NULL, false, t, t, CASE WHEN (i / 7) %% 4 = 3 THEN NULL ELSE t + interval '5 seconds' END, '1', NULL,
       jsonb_build_object('team', 't' || (i %% 10), 'env', (ARRAY['prod', 'stage', 'dev'])[1 + (i / 3) %% 3],
                          'customer', 'c' || ((i * 7919) %% 1000))
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT timestamptz '2026-01-01' + i * interval '1 second' AS t) AS at
"""
_FILL_TAGS: LiteralString = """
INSERT INTO ledgerflow.workflow_run_tags (tenant, key, value, run_id, created_at)
SELECT r.tenant, t.key, t.value, r.run_id, r.created_at
  FROM ledgerflow.workflow_runs r, jsonb_each_text(r.tags) t
"""
_GIN: LiteralString = (
    "CREATE INDEX bench_runs_tags_gin ON ledgerflow.workflow_runs USING gin (tags jsonb_path_ops)"
)
_BY_GIN: LiteralString = """
SELECT * FROM ledgerflow.workflow_runs
 WHERE tenant = %(tenant)s AND tags @> %(tags)s::jsonb AND (%(status)s::text IS NULL OR status = %(status)s)
 ORDER BY created_at DESC, run_id DESC LIMIT %(limit)s OFFSET %(offset)s
"""
_BY_OFFSET: LiteralString = """
SELECT r.* FROM ledgerflow.workflow_run_tags t JOIN ledgerflow.workflow_runs r ON r.run_id = t.run_id
 WHERE t.tenant = %(tenant)s AND t.key = %(key)s AND t.value = %(value)s
   AND (%(status)s::text IS NULL OR r.status = %(status)s)
 ORDER BY t.created_at DESC, t.run_id DESC LIMIT %(limit)s OFFSET %(offset)s
"""

#: (key, value, status): the deep page measured is 90% of the way into each one's results.
CASES: dict[str, tuple[str, str, str | None]] = {
    "common tag (team)": ("team", "t3", None),
    "rare tag (customer)": ("customer", "c42", None),
    "common tag + status": ("team", "t3", "failed"),
}
_COUNT: LiteralString = """
SELECT count(*) FROM ledgerflow.workflow_runs
 WHERE tenant = 'acme' AND tags @> %(tags)s::jsonb AND (%(status)s::text IS NULL OR status = %(status)s)
"""


def pages_of(store: EventStore, key: str, value: str, status: str | None) -> tuple[int, ...]:
    """The first page, and one 90% of the way into the results when there are more than two pages."""
    with store.pool.connection() as conn:
        row = conn.execute(_COUNT, {"tags": json.dumps({key: value}), "status": status}).fetchone()
    matches = int(row[0]) if row else 0
    deep = int(matches * 0.9) // PAGE
    return (1, deep) if deep > 2 else (1,)


def fill(store: EventStore, runs: int) -> float:
    began = time.perf_counter()
    worker = ProjectorWorker(store, [workflow_tables])
    worker.run_until_caught_up()  # creates the tables
    worker.release_all()
    with store.pool.connection() as conn:
        conn.execute(_FILL, {"n": runs})
        conn.execute(_FILL_TAGS)
        conn.execute(_GIN)
    with store.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE ledgerflow.workflow_runs")
        conn.execute("VACUUM ANALYZE ledgerflow.workflow_run_tags")
    return time.perf_counter() - began


def timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1000


def cursor_at(store: EventStore, wanted: RunFilter, page: int) -> str | None:
    """The `after` cursor of page `page` (None for the first), by walking the pages before it."""
    after = None
    for _ in range(page - 1):
        after = search_runs(store, tenant="acme", filter=wanted, limit=PAGE, after=after).next
        if after is None:
            break
    return after


def plain(store: EventStore, query: LiteralString, params: dict[str, Any]) -> int:
    with store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return len(cur.execute(query, params).fetchall())


def measure(store: EventStore, rounds: int) -> dict[str, dict[str, float]]:
    cursors: dict[tuple[str, int], str | None] = {}
    pages_measured = {name: pages_of(store, *case) for name, case in CASES.items()}
    for name, (key, value, status) in CASES.items():
        pages = pages_measured[name]
        wanted = RunFilter(tags=((key, value),), statuses=(status,) if status else ())
        for page in pages:
            cursors[(name, page)] = cursor_at(store, wanted, page)
            assert page == 1 or cursors[(name, page)] is not None, f"{name} has no page {page}"

    def ours(key: str, value: str, status: str | None, page: int, name: str) -> Callable[[], Any]:
        wanted = RunFilter(tags=((key, value),), statuses=(status,) if status else ())
        after = cursors[(name, page)]
        return lambda: search_runs(store, tenant="acme", filter=wanted, limit=PAGE, after=after)

    def gin(key: str, value: str, status: str | None, page: int) -> Callable[[], Any]:
        params = {"tenant": "acme", "tags": json.dumps({key: value}), "status": status, "limit": PAGE}
        return lambda: plain(store, _BY_GIN, {**params, "offset": (page - 1) * PAGE})

    def offset(key: str, value: str, status: str | None, page: int) -> Callable[[], Any]:
        params = {"tenant": "acme", "key": key, "value": value, "status": status, "limit": PAGE}
        return lambda: plain(store, _BY_OFFSET, {**params, "offset": (page - 1) * PAGE})

    samples: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds):
        for name, (key, value, status) in CASES.items():
            for page in pages_measured[name]:
                label = f"{name}, page {page}"
                calls = {
                    "ours": ours(key, value, status, page, name),
                    "gin": gin(key, value, status, page),
                    "offset": offset(key, value, status, page),
                }
                order = list(calls) if r % 2 == 0 else list(reversed(calls))  # alternate who goes first
                for way in order:
                    calls[way]()  # warm: plans and pages in cache for each way alike
                    samples.setdefault(label, {}).setdefault(way, []).append(timed(calls[way]))
    return {
        label: {way: statistics.median(values) for way, values in by_way.items()}
        for label, by_way in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    load_before = os.getloadavg()
    with fresh_database(args.url, "bench_search") as url, open_store(url=url) as store:
        seconds = fill(store, args.runs)
        print(f"filled {args.runs} runs (and their tag rows, and a GIN index) in {seconds:.1f} s")
        medians = measure(store, args.rounds)
    load_after = os.getloadavg()
    print(f"\nmedians of {args.rounds} rounds, ms per page of {PAGE} (ratio: that way ÷ ours)")
    print(f"{'search':42} {'ours':>8} {'gin':>8} {'offset':>8} {'gin÷ours':>9} {'offset÷ours':>12}")
    for label, m in medians.items():
        print(
            f"{label:42} {m['ours']:8.2f} {m['gin']:8.2f} {m['offset']:8.2f} "
            f"{m['gin'] / m['ours']:9.1f} {m['offset'] / m['ours']:12.1f}"
        )
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = results / f"run_search-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "runs": args.runs,
                "rounds": args.rounds,
                "page": PAGE,
                "cases": {k: list(v) for k, v in CASES.items()},
                "fill_seconds": seconds,
                "medians_ms": medians,
                "load_average": {"before": load_before, "after": load_after},
            },
            indent=2,
        )
    )
    print(f"saved {out}")


if __name__ == "__main__":
    main()

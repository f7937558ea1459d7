"""Versioned event types on a log of a million events: what `ledgerflow events types` costs, and what an
upcast read costs against a plain one.

Run by hand (it is not a test):

    python bench/event_types.py [--events 1000000] [--runs 7] [--read 20000] [--url postgresql://...]

A fresh database is filled with `--events` OrderPlaced events (INSERT ... SELECT generate_series, 5,000
rows per transaction, as bench/log_size.py fills), half stored at version 1 (`{"total": n}`) and half at
version 2 (`{"amount_cents": n, "currency": "EUR"}`), one in ten of another, undeclared type. Then:

  catalogue: the event_type_catalogue projection is built over the whole log once (a rebuild), timed;
  counts:    per run, in alternating order, `type_counts` (what `events types` reads: the catalogue's
             rows) against a count of the log itself (GROUP BY type and stored version, a full scan);
             medians and the ratio full scan / catalogue;
  reads:     per run, in alternating order, `read_all` of `--read` OrderPlaced events, half of them at
             version 1, with upcasting (those go through the 1->2 upcaster and are validated against the
             version-2 model) and the same read with `upcast=False` (plain events as stored); medians of
             events per second and of the per-run ratio upcast / plain.

Results go to bench/results/event_types-<time>.json with the load average.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel

from bench._common import default_admin_url, fresh_database, load_average, median, quiet_logs
from eventstore import Cursor, EventStore, EventTypes, ensure_partitions, open_store
from eventstore.migrate import migrate
from projector import event_type_catalogue, rebuild, type_counts

_FILL_BATCH = 5_000
_FILL = """
INSERT INTO ledgerflow.events (tenant, stream_id, stream_version, event_id, event_type, data, metadata)
SELECT 'default', 'order-' || (g / 10), g %% 10 + 1, md5(g::text)::uuid,
       CASE WHEN g %% 10 = 9 THEN 'OrderNoted' ELSE 'OrderPlaced' END,
       CASE WHEN g %% 2 = 0 THEN jsonb_build_object('total', g %% 1000)
            ELSE jsonb_build_object('amount_cents', g %% 100000, 'currency', 'EUR') END,
       CASE WHEN g %% 10 = 9 THEN '{}'::jsonb
            ELSE jsonb_build_object('$schema_version', 2 - (g + 1) %% 2) END
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
_FILL_IDS = """
INSERT INTO ledgerflow.event_ids (tenant, event_id)
SELECT 'default', md5(g::text)::uuid FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
_STREAMS = """
INSERT INTO ledgerflow.streams (tenant, stream_id, version)
SELECT 'default', 'order-' || s, 10 FROM generate_series(0, %(streams)s::bigint - 1) AS s
"""
_FULL_COUNT = """
SELECT event_type, coalesce((metadata->>'$schema_version')::int, 0), count(*)
  FROM ledgerflow.events GROUP BY 1, 2 ORDER BY 1, 2
"""
# The first version-1 events of the log, in resume order: the reads start just before the first.
_FIRST = "SELECT transaction_id::text::bigint, position FROM ledgerflow.events ORDER BY 1, 2 LIMIT 1"


class PlacedV1(BaseModel):
    total: int


class Placed(BaseModel):
    amount_cents: int
    currency: str


def bench_types() -> EventTypes:
    types = EventTypes()
    types.register("OrderPlaced", PlacedV1, 1)
    types.register("OrderPlaced", Placed, 2)
    types.add_upcaster("OrderPlaced", 1, 2, lambda d: {"amount_cents": d["total"] * 100, "currency": "EUR"})
    return types


def fill(url: str, events: int) -> float:
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_partitions(conn, headroom=events + 1)
        conn.execute("ALTER TABLE ledgerflow.events DISABLE TRIGGER events_claim_event_ids")
        for first in range(0, events, _FILL_BATCH):
            last = min(first + _FILL_BATCH, events) - 1
            with conn.transaction():
                conn.execute(_FILL, {"first": first, "last": last})
                conn.execute(_FILL_IDS, {"first": first, "last": last})
        conn.execute("ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_claim_event_ids")
        conn.execute(_STREAMS, {"streams": events // 10})
        conn.execute("VACUUM (ANALYZE) ledgerflow.events")
    return time.perf_counter() - began


def timed(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def read_events(store: EventStore, after: Cursor, n: int, *, upcast: bool) -> int:
    """Read `n` OrderPlaced events from `after` (every other one is at version 1)."""
    seen, cursor = 0, after
    while seen < n:
        page = store.read_all(cursor, limit=min(1000, n - seen), types=["OrderPlaced"], upcast=upcast)
        seen += len(page.events)
        cursor = page.cursor
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--read", type=int, default=20_000)
    parser.add_argument("--url", default=None, help="An admin URL (default: the tests' server)")
    args = parser.parse_args()
    quiet_logs()
    admin = args.url or default_admin_url()
    result: dict[str, Any] = {"events": args.events, "runs": args.runs, "load_before": load_average()}
    with fresh_database(admin, "bench_types") as url:
        migrate(url)
        result["fill_seconds"] = round(fill(url, args.events), 1)
        print(f"filled {args.events:,} events in {result['fill_seconds']} s", flush=True)
        with open_store(url=url, migrate=False, types=bench_types()) as store:
            rebuilt = timed(lambda: rebuild(store, event_type_catalogue, batch_size=5000))
            result["catalogue_build_seconds"] = round(rebuilt, 1)
            print(f"catalogue built over the log in {rebuilt:.1f} s", flush=True)
            with store.pool.connection() as conn:
                counts = type_counts(conn, None)
                full = conn.execute(_FULL_COUNT).fetchall()
                assert counts is not None
                assert [(c.event_type, c.schema_version, c.events) for c in counts] == [
                    tuple(r) for r in full
                ]
                first = conn.execute(_FIRST).fetchone()
            assert first is not None
            after = Cursor(int(first[0]), int(first[1]) - 1)
            catalogue_ms, scan_ms, scan_ratio, upcast_rate, plain_rate, read_ratio = [], [], [], [], [], []
            for run in range(args.runs):
                with store.pool.connection() as conn:
                    pair = {
                        "catalogue": lambda c=conn: type_counts(c, None),
                        "scan": lambda c=conn: c.execute(_FULL_COUNT).fetchall(),
                    }
                    order = ["catalogue", "scan"] if run % 2 == 0 else ["scan", "catalogue"]
                    took = {name: timed(pair[name]) for name in order}
                catalogue_ms.append(took["catalogue"] * 1000)
                scan_ms.append(took["scan"] * 1000)
                scan_ratio.append(took["scan"] / took["catalogue"])
                reads = {
                    "upcast": lambda: read_events(store, after, args.read, upcast=True),
                    "plain": lambda: read_events(store, after, args.read, upcast=False),
                }
                order = ["upcast", "plain"] if run % 2 == 0 else ["plain", "upcast"]
                secs = {name: timed(reads[name]) for name in order}
                upcast_rate.append(args.read / secs["upcast"])
                plain_rate.append(args.read / secs["plain"])
                read_ratio.append(secs["plain"] / secs["upcast"])
                print(
                    f"run {run + 1}: counts {took['catalogue'] * 1000:.2f} ms (catalogue) vs "
                    f"{took['scan'] * 1000:.0f} ms (scan); "
                    f"reads {args.read / secs['upcast']:,.0f}/s upcast vs "
                    f"{args.read / secs['plain']:,.0f}/s plain",
                    flush=True,
                )
            result.update(
                catalogue_ms_median=round(median(catalogue_ms), 3),
                scan_ms_median=round(median(scan_ms), 1),
                scan_over_catalogue_median=round(median(scan_ratio), 1),
                upcast_events_per_s_median=round(median(upcast_rate)),
                plain_events_per_s_median=round(median(plain_rate)),
                upcast_over_plain_median=round(median(read_ratio), 3),
                read_events=args.read,
                read_start=str(after),
            )
    result["load_after"] = load_average()
    print(json.dumps(result, indent=2))
    out = (
        Path(__file__).parent
        / "results"
        / f"event_types-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    )
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()

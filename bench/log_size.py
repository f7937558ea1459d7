"""Appends and catch-up do not slow down as the log grows: 10 million events against 100,000.

Run by hand (it is not a test):

    python bench/log_size.py [--large 10000000] [--small 100000] [--runs 5] [--url postgresql://...]

To look into one size at leisure, `--fill-only` fills both databases and keeps them (`--keep` keeps them
after a measurement); `--small-db NAME` and `--large-db NAME` measure such databases instead of filling
new ones (drop them with dropdb afterwards). A database measured again still holds the appends of its
earlier runs, so its head partition is fuller than in a fresh run.

Two databases are filled, one to `--small` events and one to `--large`, through the partitioned
`ledgerflow.events` (INSERT ... SELECT generate_series, 5,000 rows per transaction, partitions created
ahead by `ensure_partitions` as the store does), then every run measures, on each database in turn:

  append:   workload (a) of bench/append.py, one event per append, one connection, sequential
            (`--appends` of them), in events per second;
  catch-up: a reader of the global log (EventStore.read_all, as a projection catching up) reading
            `--catch-up` events near the head (ending a few thousand events before it, so that no
            transaction elsewhere on the server holds the reader back), in events per second.

Each run gives the ratio large/small of both figures; the medians over runs are printed. The target is a
ratio within 10% of 1.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    default_admin_url,
    fresh_database,
    median,
    print_table,
    quiet_logs,
    with_database,
)
from eventstore import Cursor, EventStore, NewEvent, ensure_partitions, open_store
from eventstore.migrate import migrate

# Short transactions: a transaction open anywhere on the server holds back every reader's safe horizon
# (in every database), so a fill in big transactions would stall every other reader while it runs.
_FILL_BATCH = 5_000
# The fill writes the same rows an append would (about 150 bytes of data), one stream per 10 events.
# Event ids go to ledgerflow.event_ids through the log's statement trigger (migrations/0040), one INSERT
# per batch.
_FILL = """
INSERT INTO ledgerflow.events (tenant, stream_id, stream_version, event_id, event_type, data, metadata)
SELECT 'default', 'fill-' || (g / 10), g %% 10 + 1, md5(g::text)::uuid, 'OrderPlaced',
       jsonb_build_object('order_id', 'ord-' || g, 'customer_id', md5((g * 7)::text),
                          'amount_cents', g %% 100000, 'currency', 'EUR',
                          'items', jsonb_build_array(
                              jsonb_build_object('sku', 'SKU-' || g %% 10000, 'qty', 1))),
       '{"source": "bench", "v": 1}'
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
_CURSOR_BEFORE_LAST = """
SELECT transaction_id::text::bigint, position FROM ledgerflow.events
 ORDER BY transaction_id DESC, position DESC OFFSET %(n)s LIMIT 1
"""


def fill(url: str, events: int) -> float:
    """Fill the log to `events` events; return the seconds it took."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_partitions(conn, headroom=events + 1)
        for first in range(0, events, _FILL_BATCH):
            last = min(first + _FILL_BATCH, events) - 1
            with conn.transaction():
                conn.execute(_FILL, {"first": first, "last": last})
            if (last + 1) % 1_000_000 == 0 or last + 1 == events:
                print(f"  filled {last + 1:,} of {events:,}", flush=True)
        conn.execute("VACUUM (ANALYZE) ledgerflow.events")
        conn.execute("VACUUM (ANALYZE) ledgerflow.event_ids")
    return time.perf_counter() - began


def measure_appends(store: EventStore, n: int) -> float:
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    events = [
        NewEvent("OrderPaid", {"order_id": f"ord-{i}", "amount_cents": i, "currency": "EUR"})
        for i in range(n)
    ]
    began = time.perf_counter()
    for i, event in enumerate(events):
        store.append(f"{stream}-{i % 100}", [event])
    return n / (time.perf_counter() - began)


def measure_catch_up(store: EventStore, url: str, n: int, margin: int) -> float:
    """Read `n` events of the global log, as a projection catching up does, ending `margin` events
    before the head: recent appends may still wait behind the safe horizon, which on a shared server any
    transaction of any database holds back, and the reader would wait for it rather than read."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_CURSOR_BEFORE_LAST, {"n": n + margin}).fetchone()
    assert row is not None
    cursor = Cursor(int(row[0]), int(row[1]))
    read = 0
    began = time.perf_counter()
    while read < n:
        page = store.read_all(cursor, limit=min(1000, n - read))
        read += len(page.events)
        cursor = page.cursor
    return read / (time.perf_counter() - began)


@contextmanager
def _database(admin_url: str, prefix: str, *, keep: bool) -> Iterator[str]:
    """A new database, dropped afterwards, or kept for later runs (see --small-db, --large-db)."""
    if not keep:
        with fresh_database(admin_url, prefix) as url:
            yield url
        return
    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield with_database(admin_url, name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", default=default_admin_url(), help="a superuser's URL (databases are created)"
    )
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--catch-up", type=int, default=20_000)
    parser.add_argument(
        "--keep", action="store_true", help="keep the databases afterwards (their names are printed)"
    )
    parser.add_argument(
        "--fill-only", action="store_true", help="fill both databases and stop (implies --keep)"
    )
    parser.add_argument("--small-db", help="measure this filled database instead of filling a new one")
    parser.add_argument("--large-db", help="measure this filled database instead of filling a new one")
    args = parser.parse_args()
    quiet_logs()
    keep = args.keep or args.fill_only
    given = {"small": args.small_db, "large": args.large_db}
    with ExitStack() as stack:
        urls = {}
        for label, name in given.items():
            if name is not None:
                urls[label] = with_database(args.url, name)
                continue
            url = stack.enter_context(_database(args.url, f"bench_{label}", keep=keep))
            urls[label] = url
            migrate(url)
            size = args.small if label == "small" else args.large
            print(f"filling the {label} log to {size:,} events", flush=True)
            print(f"  {fill(url, size):.0f} s", flush=True)
            if keep:
                print(f"  kept as database {psycopg.conninfo.conninfo_to_dict(url)['dbname']}", flush=True)
        if args.fill_only:
            return
        stores = {label: open_store(url=url, migrate=False) for label, url in urls.items()}
        try:
            for store in stores.values():  # warm-up: connections and plans ready
                measure_appends(store, args.appends)
            rows = []
            append_ratios, catch_up_ratios = [], []
            for run in range(1, args.runs + 1):
                rates: dict[str, tuple[float, float]] = {}
                order = ("small", "large") if run % 2 else ("large", "small")
                for label in order:
                    appends = measure_appends(stores[label], args.appends)
                    catch_up = measure_catch_up(stores[label], urls[label], args.catch_up, 2 * args.appends)
                    rates[label] = (appends, catch_up)
                append_ratio = rates["large"][0] / rates["small"][0]
                catch_up_ratio = rates["large"][1] / rates["small"][1]
                append_ratios.append(append_ratio)
                catch_up_ratios.append(catch_up_ratio)
                rows.append(
                    [
                        str(run),
                        f"{rates['small'][0]:,.0f}",
                        f"{rates['large'][0]:,.0f}",
                        f"{append_ratio:.3f}",
                        f"{rates['small'][1]:,.0f}",
                        f"{rates['large'][1]:,.0f}",
                        f"{catch_up_ratio:.3f}",
                    ]
                )
                print(
                    f"run {run}: append ratio {append_ratio:.3f}, catch-up ratio {catch_up_ratio:.3f}",
                    flush=True,
                )
        finally:
            for store in stores.values():
                store.close()
    print()
    print(
        f"log sizes: small {args.small:,}, large {args.large:,} events; "
        "rates in events/s; ratio = large/small"
    )
    print_table(
        ["run", "append small", "append large", "ratio", "catch-up small", "catch-up large", "ratio"], rows
    )
    print(
        f"median append ratio {median(append_ratios):.3f}, "
        f"median catch-up ratio {median(catch_up_ratios):.3f}"
    )


if __name__ == "__main__":
    main()

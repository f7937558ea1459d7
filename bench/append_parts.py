"""Where a one-event append's CPU goes: the append statement taken apart, and the notifier's share.

Run by hand (it is not a test):

    python bench/append_parts.py [--runs 7] [--appends 1500] [--url postgresql://postgres@127.0.0.1:5432/postgres]

bench/append.py says how far ledgerflow's one-event append is from a plain INSERT; this says why. Each run
(on a fresh database, the order rotating between runs) measures the server CPU per statement of one
backend, from /proc/<pid>/stat, while it runs `--appends` one-event statements, each built up from the
previous by one part of ledgerflow's append:

  plain          INSERT into a plain table (bench/append.py's baseline), stream versions from the client;
  twin           the same into the partitioned log's twin with its event-id trigger;
  log            the same into ledgerflow.events itself;
  +writer        ... with the log writer lock and the transaction's stamp (the `writer` CTE);
  +returning     ... returning what an append returns;
  append         ledgerflow's statement (queries.sql append_one_event, expected version ANY): the same,
                 the stream's version moved in ledgerflow.streams (`bump_any`) instead of sent;
  bump           the `writer` and `bump_any` parts alone, as a statement of their own.

All are prepared (psycopg's prepare=True) and run on one autocommit connection. Then the store itself,
`EventStore.append` through its pinned connection and libpq (eventstore/direct.py), with and without its
notifier, alternating: client CPU (this process, every thread) and server CPU (every backend of the
database), and the appending backend's and the notifier's separately.

The load average is printed: on a loaded machine every figure grows; compare parts within one run. Results
are printed and written to bench/results/append_parts-<UTC time>.json with the commit and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Payload,
    create_plain_table,
    create_twin_table,
    default_admin_url,
    dump_json,
    fresh_database,
    load_average,
    make_payloads,
    median,
    print_table,
    quiet_logs,
)
from bench.append import git_commit
from eventstore import DatabaseSettings, EventStore, NewEvent, append_statements, open_store
from eventstore.events import ExpectedState
from eventstore.migrate import migrate

_TICK = os.sysconf("SC_CLK_TCK")
RESULTS = Path(__file__).resolve().parent / "results"
_COLUMNS = (
    "tenant, stream_id, stream_version, event_id, event_type, data, metadata, correlation_id, causation_id"
)
_VALUES = "%(tenant)s, %(stream_id)s, %(version)s, %(event_id)s, %(type)s, %(one_data)s::jsonb, " + (
    "%(one_metadata)s::jsonb, NULL, NULL"
)
_WRITER = append_statements.Q["writer"]
_RETURNING = " RETURNING e.stream_id, e.stream_version, e.position, e.transaction_id::text::bigint"
STATEMENTS = {
    "plain": f"INSERT INTO bench_plain.events ({_COLUMNS}) VALUES ({_VALUES})",
    "twin": f"INSERT INTO bench_twin.events ({_COLUMNS}) VALUES ({_VALUES})",
    "log": f"INSERT INTO ledgerflow.events ({_COLUMNS}) VALUES ({_VALUES})",
    "+writer": f"{_WRITER} INSERT INTO ledgerflow.events AS e (transaction_id, {_COLUMNS})"
    f" SELECT w.stamp, {_VALUES} FROM writer w",
    "+returning": f"{_WRITER} INSERT INTO ledgerflow.events AS e (transaction_id, {_COLUMNS})"
    f" SELECT w.stamp, {_VALUES} FROM writer w{_RETURNING}",
    "append": append_statements._ONE_EVENT[ExpectedState.ANY].decode(),
    "bump": f"{_WRITER}, bumped AS ({append_statements.Q['bump_any']}) SELECT base FROM bumped",
}


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid`."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def statement_cpu(conn: psycopg.Connection[Any], query: str, payloads: Sequence[Payload], tag: str) -> float:
    """Server CPU microseconds per execution of `query`, one event per execution, 50 streams."""
    wanted = set(re.findall(r"%\((\w+)\)s", query))
    versions: dict[str, int] = {}
    params = []
    for i, p in enumerate(payloads):
        stream = f"{tag}-{i % 50}"
        versions[stream] = versions.get(stream, 0) + 1
        every = {
            "tenant": "default",
            "stream_id": stream,
            "version": versions[stream],
            "count": 1,
            "expected": None,
            "event_id": uuid.uuid4(),
            "type": p.type,
            "one_data": dump_json(p.data),
            "one_metadata": dump_json(p.metadata),
            "correlation_id": None,
            "causation_id": None,
        }
        params.append({k: v for k, v in every.items() if k in wanted})
    pid = conn.info.backend_pid
    before = backend_cpu(pid)
    for one in params:
        conn.execute(query, one, prepare=True)
    return (backend_cpu(pid) - before) / len(params) * 1e6


def store_cpu(
    store: EventStore, probe: psycopg.Connection[Any], payloads: Sequence[Payload], tag: str
) -> dict[str, float]:
    """Client and server CPU microseconds per `store.append` of one event; the server's split into the
    appending backend's and the notifier's."""
    rows = probe.execute(
        "SELECT pid, application_name FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    with store.statement_connection() as conn:
        own = conn.info.backend_pid
    before = {pid: backend_cpu(pid) for pid, _ in rows}
    client = time.process_time()
    for i, p in enumerate(payloads):
        store.append(f"{tag}-{i % 50}", [NewEvent(p.type, p.data, p.metadata)])
    client = time.process_time() - client
    time.sleep(0.05)  # the last wake-up
    used = {pid: backend_cpu(pid) - before[pid] for pid, _ in rows}
    n = len(payloads)
    return {
        "client": client / n * 1e6,
        "server": sum(used.values()) / n * 1e6,
        "appending backend": used.get(own, 0.0) / n * 1e6,
        "notifier backend": sum(used[pid] for pid, app in rows if app == "ledgerflow-notifier") / n * 1e6,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--appends", type=int, default=1500, help="one-event statements per measurement")
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args(argv)
    quiet_logs()
    load_start = load_average()
    print(f"load average at start: {load_start}")
    payloads = make_payloads(args.appends, seed=1)
    parts: dict[str, list[float]] = {}
    stores: dict[str, dict[str, list[float]]] = {}
    for run in range(args.runs):
        with fresh_database(args.url, prefix="bench_append_parts") as url:
            migrate(url)
            differences = create_plain_table(url, "ledgerflow.events", "ledgerflow.event_ids", "bench_plain")
            differences += create_twin_table(url, "ledgerflow.events", "bench_twin")
            if differences:
                raise SystemExit("a baseline table is not what it should be:\n" + "\n".join(differences))
            settings = DatabaseSettings(database_url=url, pool_min_size=1)
            with (
                psycopg.connect(url, autocommit=True) as conn,
                psycopg.connect(url, autocommit=True) as probe,
                open_store(settings, url=url, migrate=False, name="notifying") as notifying,
                open_store(settings, url=url, migrate=False, name="silent") as silent,
            ):
                # The same store without its wake-ups (its notifier has not started: nothing was appended).
                assert silent._notifier is not None
                silent._notifier.close()
                silent._notifier = None
                names = list(STATEMENTS)
                for name in names:  # prepared and warm before anything is measured
                    statement_cpu(conn, STATEMENTS[name], payloads[:200], f"warm-{name}")
                for s in (notifying, silent):
                    for p in payloads[:200]:
                        s.append("warm", [NewEvent(p.type, p.data, p.metadata)])
                shift = run % len(names)
                for name in names[shift:] + names[:shift]:
                    parts.setdefault(name, []).append(
                        statement_cpu(conn, STATEMENTS[name], payloads, f"r{run}-{name}")
                    )
                pair = [("with notifier", notifying), ("without", silent)]
                for label, s in pair if run % 2 == 0 else pair[::-1]:
                    for key, value in store_cpu(s, probe, payloads, f"r{run}-{label}").items():
                        stores.setdefault(label, {}).setdefault(key, []).append(value)
        print(f"run {run + 1}/{args.runs} done", flush=True)
    load_end = load_average()
    print(f"load average at end: {load_end}\n")
    load_start_end = {"start": load_start, "end": load_end}
    print("Server CPU per one-event statement, microseconds, median (min-max) over runs:")
    print_table(
        ["statement", "server µs", "runs"],
        [[n, f"{median(v):.0f}", f"{min(v):.0f}-{max(v):.0f}"] for n, v in parts.items()],
    )
    print("\nEventStore.append, one event, CPU microseconds per append, median over runs:")
    keys = ["client", "server", "appending backend", "notifier backend"]
    print_table(
        ["store", *keys],
        [[label, *(f"{median(per[k]):.0f}" for k in keys)] for label, per in stores.items()],
    )
    commit, dirty = git_commit()
    saved = {
        "benchmark": "append_parts",
        "commit": commit,
        "dirty": dirty,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load_start_end,
        "settings": {"runs": args.runs, "appends": args.appends},
        "server_us_per_statement": {n: {"runs": v, "median": median(v)} for n, v in parts.items()},
        "store_cpu_us_per_append": {
            label: {k: {"runs": v, "median": median(v)} for k, v in per.items()}
            for label, per in stores.items()
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"append_parts-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

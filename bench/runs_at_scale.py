"""Runs at scale: listing, searching, a new run's visibility, a bulk cancel and recovery, with many ended
runs in the run tables and many in flight.

Run by hand (it is not a test):

    python -m bench.runs_at_scale [--ended 1000000] [--inflight 10000] [--rounds 5] [--workers 2]
        [--concurrency 250] [--cancel-rounds 3] [--slices 10] [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database.

Fill. `--ended` ended runs are written straight into the run tables of the `workflow_tables` projection
(ledgerflow.workflow_runs and its tag rows, ledgerflow.workflow_run_tags), in chunks of bulk SQL, in the
shape the projection writes them: three workflows, three statuses, tags `team` (10 values), `env` (3) and
`customer` (1,000), started one per second over the past. Their log events are not written: listing and
searching read only these tables (the projector reads the log from its cursor, so the log's size changes
neither), and writing 4 events per run through the log would make the fill the benchmark. `--inflight`
runs are then started for real (`Engine.start`, a workflow whose one node holds until killed), tagged
`slice=K` (`--slices` of them) for the bulk cancel's rounds, and projected.

Measured, each as medians over `--rounds` rounds (the p99 of 200 calls per round for the searches):

  list first / deep    `search_runs` with no filter: the first page, and the page 90% of the way down
                       (keyset: its cursor built from the row at that place, found once, untimed);
  tag first / deep     the same with a tag filter (`team`, ~10% of the runs);
  visible              a run started with a projector running in this process: from `Engine.start`'s
                       return until `search_runs` (filtered by the run's own tag) lists it;
  recovery             `--workers` `ledgerflow worker` processes of `--concurrency` node threads each
                       hold as many runs' nodes; every worker is SIGKILLed and as many are started again
                       under the same names; from their spawn until every node they held runs again;
  bulk cancel          `create_bulk_action` + `run_bulk_action` over one slice of the in-flight runs
                       per round (`--cancel-rounds` rounds): seconds, runs per second, and 10,000 runs'
                       time at that rate (a cancel's cost does not grow with the action: keyset pages).

Ratios: deep page ÷ first page (the keyset's promise: about 1), and each figure ÷ the target the issue sets
(under 1 meets it). The machine's load average is recorded before and after each phase: other work shares
this machine. JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import compileall
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, LiteralString

from bench._common import default_admin_url, fresh_database, quiet_logs
from eventstore import EventStore, open_store
from projector import ProjectorWorker
from workflows import (
    Engine,
    NodeContext,
    RunFilter,
    Workflow,
    WorkflowRegistry,
    create_bulk_action,
    run_bulk_action,
    search_runs,
    workflow_tables,
)
from workflows.run_search import cursor_at

PAGE = 50
CALLS = 200
HOLD = "scale_hold"
ROOT = Path(__file__).resolve().parents[1]
#: The issue's targets (seconds).
TARGETS = {"search_p99": 0.050, "visible": 0.200, "bulk_cancel_10000": 30.0, "recovery": 10.0}

registry = WorkflowRegistry()
_hold = Workflow(HOLD)


@_hold.node(max_crashes=1000)  # killed every round: never parked for it
def hold(ctx: NodeContext) -> None:
    # In flight until its worker is killed: the recovery measures how soon it runs again elsewhere.
    while True:
        time.sleep(3600)


registry.register(_hold)

_FILL: LiteralString = """
INSERT INTO ledgerflow.workflow_runs (run_id, tenant, workflow, key, status, current_node, nodes_total,
                                      nodes_done, input, error, cancel_requested, created_at, updated_at,
                                      finished_at, workflow_version, triggered_by, tags)
SELECT gen_random_uuid(), 'default', 'wf' || (i %% 3), NULL,
       (ARRAY['succeeded', 'failed', 'cancelled'])[1 + (i / 7) %% 3], NULL, 3, 3, 'null'::jsonb,
       NULL, false, t, t + interval '5 seconds', t + interval '5 seconds', '1', NULL,
       jsonb_build_object('team', 't' || (i %% 10), 'env', (ARRAY['prod', 'stage', 'dev'])[1 + (i / 3) %% 3],
                          'customer', 'c' || ((i::bigint * 7919) %% 1000))
  FROM generate_series(%(first)s::int, %(last)s::int) AS i,
       LATERAL (SELECT now() - interval '400 days' + i * interval '1 second' AS t) AS at
"""
#: The (created_at, run_id) of the row `offset` rows down a search's order (found once, untimed).
_AT_RUNS: LiteralString = """
SELECT created_at, run_id FROM ledgerflow.workflow_runs WHERE tenant = 'default'
 ORDER BY created_at DESC, run_id DESC OFFSET %(offset)s LIMIT 1
"""
_AT_TAG: LiteralString = """
SELECT created_at, run_id FROM ledgerflow.workflow_run_tags
 WHERE tenant = 'default' AND key = %(key)s AND value = %(value)s
 ORDER BY created_at DESC, run_id DESC OFFSET %(offset)s LIMIT 1
"""
_COUNT_TAG: LiteralString = """
SELECT count(*) FROM ledgerflow.workflow_run_tags
 WHERE tenant = 'default' AND key = %(key)s AND value = %(value)s
"""
#: Nodes of the held runs running now under a lease claimed after `since` (by the restarted workers).
_RUNNING_SINCE: LiteralString = """
SELECT count(*) FROM ledgerflow.workflow_queue
 WHERE workflow = %(workflow)s AND status = 'claimed' AND claimed_at >= %(since)s
"""


def loads() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def scalar(store: EventStore, query: LiteralString, params: dict[str, Any]) -> Any:
    with store.pool.connection() as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def project(store: EventStore) -> None:
    worker = ProjectorWorker(store, [workflow_tables])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()


#: A table's indexes, its primary key's among them (with the constraint's name), to drop and build again.
_INDEXES: LiteralString = """
SELECT x.relname AS name, pg_get_indexdef(i.indexrelid) AS definition, c.conname AS constraint_name
  FROM pg_index i
  JOIN pg_class x ON x.oid = i.indexrelid
  LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
 WHERE i.indrelid = %(table)s::regclass
"""
_FILLED_TABLES = ("ledgerflow.workflow_runs", "ledgerflow.workflow_run_tags")


#: An index to build again: its table, its name, its definition and its constraint's name (a primary key's).
Index = tuple[str, str, str, str | None]


def drop_indexes(conn: Any, table: str) -> list[Index]:
    """Drop `table`'s indexes (and its primary key) and return what builds them again, as they were."""
    indexes = conn.execute(_INDEXES, {"table": table}).fetchall()
    for name, _definition, constraint in indexes:
        if constraint is not None:
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {constraint}")
        else:
            conn.execute(f"DROP INDEX ledgerflow.{name}")
    return [(table, *index) for index in indexes]


def build_indexes(conn: Any, indexes: list[Index]) -> None:
    for table, name, definition, constraint in indexes:
        conn.execute(definition)
        if constraint is not None:
            conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {constraint} PRIMARY KEY USING INDEX {name}")


def fill(store: EventStore, ended: int, chunk: int = 1_000_000) -> float:
    """Write the ended runs and their tags as a bulk load is done: the tables' indexes dropped first and
    built again after, as they were (sorted in one pass each, where row by row a random uuid key touches
    a random page of an index far larger than the server's buffers: 10,000,000 runs took 439 s that way
    and their 30,000,000 tag rows had not gone in after 400 s more). What is searched is the same."""
    began = time.perf_counter()
    project(store)  # creates the run tables
    with store.pool.connection() as conn:
        indexes = [index for table in _FILLED_TABLES for index in drop_indexes(conn, table)]
    for first in range(1, ended + 1, chunk):
        last = min(ended, first + chunk - 1)
        with store.pool.connection() as conn:
            conn.execute(_FILL, {"first": first, "last": last})
        print(f"  filled {last:,} ended runs ({time.perf_counter() - began:.0f} s)", flush=True)
    with store.pool.connection() as conn:
        conn.execute(
            "INSERT INTO ledgerflow.workflow_run_tags (tenant, key, value, run_id, created_at) "
            "SELECT r.tenant, t.key, t.value, r.run_id, r.created_at "
            "FROM ledgerflow.workflow_runs r, jsonb_each_text(r.tags) t"
        )
    print(f"  filled their tags ({time.perf_counter() - began:.0f} s)", flush=True)
    with store.pool.connection() as conn:
        conn.execute("SET maintenance_work_mem = '2GB'")
        conn.execute("SET max_parallel_maintenance_workers = 2")
        build_indexes(conn, indexes)
    print(f"  built {len(indexes)} indexes again ({time.perf_counter() - began:.0f} s)", flush=True)
    with store.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE ledgerflow.workflow_runs")
        conn.execute("VACUUM ANALYZE ledgerflow.workflow_run_tags")
    return time.perf_counter() - began


def start_inflight(engine: Engine, count: int, slices: int, threads: int = 4) -> list[uuid.UUID]:
    def some(index: int) -> list[uuid.UUID]:
        return [
            engine.start(HOLD, input=None, tags={"slice": str(i % slices), "team": f"t{i % 10}"}).run_id
            for i in range(index, count, threads)
        ]

    with ThreadPoolExecutor(threads) as pool:
        return [r for ids in pool.map(some, range(threads)) for r in ids]


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def search_cases(store: EventStore) -> dict[str, Callable[[], object]]:
    total = scalar(store, "SELECT count(*) FROM ledgerflow.workflow_runs WHERE tenant = 'default'", {})
    tag = {"key": "team", "value": "t3"}
    tagged = scalar(store, _COUNT_TAG, tag)
    with store.pool.connection() as conn:
        deep_runs = conn.execute(_AT_RUNS, {"offset": int(total * 0.9)}).fetchone()
        deep_tag = conn.execute(_AT_TAG, {**tag, "offset": int(tagged * 0.9)}).fetchone()
    assert deep_runs is not None
    assert deep_tag is not None
    everything, by_tag = RunFilter(), RunFilter(tags=(("team", "t3"),))
    after_runs = cursor_at("default", everything, deep_runs[0], deep_runs[1])
    after_tag = cursor_at("default", by_tag, deep_tag[0], deep_tag[1])

    def page(wanted: RunFilter, after: str | None) -> Callable[[], object]:
        def call() -> object:
            found = search_runs(store, tenant="default", filter=wanted, limit=PAGE, after=after)
            assert len(found.runs) == PAGE
            return found

        return call

    print(f"  searching {total:,} runs; tag team=t3 on {tagged:,}; deep pages 90% down")
    return {
        "list_first": page(everything, None),
        "list_deep": page(everything, after_runs),
        "tag_first": page(by_tag, None),
        "tag_deep": page(by_tag, after_tag),
    }


def search_round(cases: dict[str, Callable[[], object]], index: int) -> dict[str, float]:
    names = list(cases) if index % 2 == 0 else list(reversed(cases))
    out = {}
    for name in names:
        times = []
        for _ in range(CALLS):
            began = time.perf_counter()
            cases[name]()
            times.append(time.perf_counter() - began)
        out[name] = p99(times)
    return out


def visible_round(engine: Engine, samples: int = 5) -> float:
    seen = []
    for _ in range(samples):
        mark = uuid.uuid4().hex[:12]
        run_id = engine.start(HOLD, input=None, tags={"probe": mark}).run_id
        began = time.perf_counter()
        wanted = RunFilter(tags=(("probe", mark),))
        while not search_runs(engine.store, tenant="default", filter=wanted, limit=1).runs:
            if time.perf_counter() - began > 60:
                raise TimeoutError(f"run {run_id} not listed after 60 s")
            time.sleep(0.002)
        seen.append(time.perf_counter() - began)
    return statistics.median(seen)


def worker(url: str, name: str, concurrency: int, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "bench.runs_at_scale:registry",
        "LEDGERFLOW_WORKER_CONCURRENCY": str(concurrency),
        "LEDGERFLOW_LOG_LEVEL": "warning",
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "worker", "--name", name],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout} s")
        time.sleep(0.01)


def recoveries(
    store: EventStore, url: str, workers: int, concurrency: int, rounds: int, log: Path
) -> list[dict[str, float]]:
    """Workers hold `workers * concurrency` nodes; each round SIGKILLs all of them and starts as many
    again under the same names: seconds from their spawn until every held node runs again (claimed by
    them)."""
    names = [f"scale-{i}" for i in range(workers)]
    held = workers * concurrency
    since = scalar(store, "SELECT clock_timestamp()", {})
    procs = [worker(url, n, concurrency, log) for n in names]
    out: list[dict[str, float]] = []

    def all_running(since: datetime) -> bool:
        exited = [p.returncode for p in procs if p.poll() is not None]
        if exited:  # a worker that refused its settings, say: waiting would only time out
            raise RuntimeError(f"{len(exited)} worker(s) exited (codes {exited}); see {log}")
        return bool(scalar(store, _RUNNING_SINCE, {"workflow": HOLD, "since": since}) >= held)

    try:
        wait(lambda: all_running(since), 300, f"{held} nodes running")
        for _ in range(rounds):
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait()
            since = scalar(store, "SELECT clock_timestamp()", {})
            began = time.perf_counter()
            procs = [worker(url, n, concurrency, log) for n in names]
            wait(functools.partial(all_running, since), 300, f"{held} nodes running again")
            out.append({"seconds": time.perf_counter() - began, "nodes": held})
            print(f"  recovery round {len(out)}: {out[-1]['seconds']:.2f} s", flush=True)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
    return out


def cancel_round(engine: Engine, slice_index: int) -> dict[str, float]:
    wanted = RunFilter(tags=(("slice", str(slice_index)),), statuses=("running",))
    began = time.perf_counter()
    action = create_bulk_action(
        engine.store, kind="cancel", tenant="default", filter=wanted, actor="bench", limit=10_000_000
    )
    ended = run_bulk_action(engine, action.id, tenant="default")
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "runs": ended.done, "skipped": ended.skipped, "failed": ended.failed}


def background_projector(store: EventStore, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        worker = ProjectorWorker(store, [workflow_tables])
        try:
            while not stop.is_set():
                worker.run_until_caught_up()
                stop.wait(0.005)
        finally:
            worker.release_all()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ended", type=int, default=1_000_000)
    parser.add_argument("--inflight", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=250)
    parser.add_argument("--cancel-rounds", type=int, default=3)
    parser.add_argument("--slices", type=int, default=10, help="the in-flight runs' slices (one per cancel)")
    parser.add_argument("--url", default=default_admin_url())
    args = parser.parse_args()
    quiet_logs()
    # The workers' bytecode, as a wheel's install writes it: under PYTHONDONTWRITEBYTECODE (this machine
    # sets it) an editable checkout compiles every module at every worker start (bench/recovery_phases.py).
    for package in ("eventstore", "projector", "workflows", "ops", "bench"):
        compileall.compile_dir(ROOT / package, quiet=1)
    result: dict[str, Any] = {"args": vars(args), "load": {"start": loads()}, "machine_cpus": os.cpu_count()}
    with fresh_database(args.url, "bench_scale") as url, open_store(url=url) as store:
        engine = Engine(store, registry)
        print(f"fill: {args.ended:,} ended runs (bulk SQL into the run tables)", flush=True)
        result["fill_seconds"] = fill(store, args.ended)
        result["load"]["after_fill"] = loads()
        began = time.perf_counter()
        if args.cancel_rounds > args.slices:
            parser.error("--cancel-rounds takes one slice each: at most --slices")
        inflight = start_inflight(engine, args.inflight, args.slices)
        project(store)
        result["inflight_start_seconds"] = time.perf_counter() - began
        result["load"]["after_inflight"] = loads()
        print(f"  {len(inflight):,} runs in flight ({result['inflight_start_seconds']:.0f} s)", flush=True)

        cases = search_cases(store)
        searches = [search_round(cases, i) for i in range(args.rounds)]
        result["search_p99_seconds"] = {n: statistics.median(r[n] for r in searches) for n in cases}
        result["search_rounds"] = searches
        result["load"]["after_search"] = loads()

        stop = threading.Event()
        thread = background_projector(store, stop)
        try:
            visible = [visible_round(engine) for _ in range(args.rounds)]
        finally:
            stop.set()
            thread.join(timeout=30)
        result["visible_seconds"] = {"median": statistics.median(visible), "rounds": visible}
        result["load"]["after_visible"] = loads()

        log = Path(tempfile.gettempdir()) / f"runs_at_scale-workers-{os.getpid()}.log"
        rounds = recoveries(store, url, args.workers, args.concurrency, args.rounds, log)
        result["recovery"] = {
            "median_seconds": statistics.median(r["seconds"] for r in rounds),
            "rounds": rounds,
        }
        result["load"]["after_recovery"] = loads()

        cancels = [cancel_round(engine, i) for i in range(args.cancel_rounds)]
        rates = [c["runs"] / c["seconds"] for c in cancels]
        result["bulk_cancel"] = {
            "median_seconds": statistics.median(c["seconds"] for c in cancels),
            "median_runs_per_second": statistics.median(rates),
            "seconds_for_10000_at_that_rate": 10_000 / statistics.median(rates),
            "rounds": cancels,
        }
        result["load"]["end"] = loads()
    report(result)


def report(result: dict[str, Any]) -> None:
    s = result["search_p99_seconds"]
    print(
        f"\nended runs {result['args']['ended']:,} (fill {result['fill_seconds']:.0f} s), in flight "
        f"{result['args']['inflight']:,}; medians of {result['args']['rounds']} rounds"
    )
    for name in ("list", "tag"):
        first, deep = s[f"{name}_first"], s[f"{name}_deep"]
        print(
            f"{name:5} search p99: first page {first * 1000:7.1f} ms, deep page {deep * 1000:7.1f} ms "
            f"(deep ÷ first {deep / first:.2f}; "
            f"÷ 50 ms target {max(first, deep) / TARGETS['search_p99']:.2f})"
        )
    vis = result["visible_seconds"]["median"]
    print(f"new run listed after {vis * 1000:.0f} ms (÷ 200 ms target {vis / TARGETS['visible']:.2f})")
    rec = result["recovery"]
    print(
        f"recovery: {rec['rounds'][0]['nodes']} held nodes running again after {rec['median_seconds']:.1f} s "
        f"(÷ 10 s target {rec['median_seconds'] / TARGETS['recovery']:.2f})"
    )
    bc = result["bulk_cancel"]
    print(
        f"bulk cancel: {bc['median_runs_per_second']:.0f} runs/s, {bc['median_seconds']:.1f} s per round of "
        f"{bc['rounds'][0]['runs']:,}; 10,000 at that rate {bc['seconds_for_10000_at_that_rate']:.0f} s "
        f"(÷ 30 s target {bc['seconds_for_10000_at_that_rate'] / TARGETS['bulk_cancel_10000']:.2f})"
    )
    print(f"load average (1, 5, 15 min) along the way: {result['load']}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results / f"runs_at_scale-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"saved {path}")


if __name__ == "__main__":
    main()

"""Fair claims (migration 0028): claim throughput with 1 and with 100 tenants, against the claim it replaced,
and another tenant's start-to-first-node latency behind a 2,000-run backlog on a real worker.

Run by hand (it is not a test):

    python -m bench.fair_claims [--runs 3] [--url postgresql://postgres@127.0.0.1:5432/postgres]

(a) Claim throughput. A queue of `--rows` ready one-node runs (queue rows and run streams, as a start
    leaves them) in 1 tenant, or spread evenly over 100; `--claimers` threads, each on its own connection,
    claim with ledgerflow.wf_claim (one statement in autocommit, as the worker does, NodeClaimed appends
    included) until the queue is empty; nodes claimed per second. Measured for the fair claim and for the
    claim of migration 0027 (the one it replaced: ready order over every tenant, on its own index) on an
    identical queue, each on its own database cloned from one migrated template, in rotating order per
    run; with a claim limit of 8 (the claim loop with free threads) and of 1 (the claim at a run's end).
(b) Latency. A `ledgerflow worker` process (`--threads` node threads) works through tenant A's 2,000 runs,
    each one node of `--busy-ms`; meanwhile tenant B starts a one-node run every `--every` seconds. From
    the log (one clock, the database's): B's RunStarted to its NodeClaimed and to its NodeSucceeded. Also
    with the old claim, for a few of B's runs (they wait for the whole backlog).

Results are printed and written to bench/results/fair_claims-<time>.json with the commit, the machine and
its load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench._common import default_admin_url, load_average, median, quiet_logs, with_database
from eventstore import open_store
from eventstore.migrate import migrate
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _workflow(name: str, busy_ms: float) -> Workflow:
    wf = Workflow(name)

    @wf.node()
    def only(ctx: NodeContext) -> None:
        time.sleep(busy_ms / 1000)

    return wf


#: The worker's registry (LEDGERFLOW_WORKFLOWS=bench.fair_claims:registry).
registry = WorkflowRegistry()
registry.register(_workflow("busy", float(os.environ.get("BENCH_BUSY_MS", "40"))))
registry.register(_workflow("probe", 0))


def _old_claim(name: str) -> str:
    """Migration 0027's wf_claim, under `name`."""
    text = (ROOT / "migrations" / "0027_run_end_in_one_statement.sql").read_text()
    body = text[text.index("CREATE FUNCTION ledgerflow.wf_claim(") : text.index("-- The rows: first the end")]
    return body.replace("CREATE FUNCTION ledgerflow.wf_claim(", f"CREATE OR REPLACE FUNCTION {name}(", 1)


#: The old claim's schema: its index instead of the fair one (with both, each claim could use either).
OLD_SCHEMA = [
    "DROP INDEX ledgerflow.workflow_queue_ready_fair",
    "CREATE INDEX workflow_queue_ready_by_version ON ledgerflow.workflow_queue (workflow, version, ready_at)"
    " WHERE status = 'ready'",
]


@contextmanager
def database(admin: str, template: str | None = None) -> Iterator[str]:
    name = f"bench_fair_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
        conn.execute(create)
    try:
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


SEED = """
WITH queued AS (
    INSERT INTO ledgerflow.workflow_queue
           (run_id, node, tenant, workflow, version, max_crashes, ready_at, priority)
    SELECT gen_random_uuid(), 'only', 't' || lpad((i %% %(tenants)s)::text, 3, '0'), 'busy', '1', 3,
           clock_timestamp() - interval '1 hour' + make_interval(secs => i), 0
      FROM generate_series(1, %(rows)s) AS i
    RETURNING run_id, tenant)
INSERT INTO ledgerflow.streams (tenant, stream_id, version) SELECT tenant, 'wf-' || run_id, 1 FROM queued
"""


def claim_throughput(url: str, function: str, claimers: int, limit: int) -> float:
    """Nodes claimed per second by `claimers` threads claiming with `function` until the queue is empty."""
    counts = [0] * claimers
    barrier = threading.Barrier(claimers + 1)
    statement = (
        f"SELECT count(*) FROM {function}('bench', %(instance)s, 'bench/1', ARRAY['busy'], ARRAY['1'],"
        " %(limit)s, 60)"
    )

    def claimer(i: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement, {"instance": f"i{i}", "limit": limit})  # plans cached, before the clock
            barrier.wait()
            while True:
                (n,) = conn.execute(statement, {"instance": f"i{i}", "limit": limit}).fetchone() or (0,)
                if not n:
                    return
                counts[i] += int(n)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join(timeout=600)
    return sum(counts) / (time.perf_counter() - began)


def throughput_part(admin: str, template: str, args: argparse.Namespace) -> dict[str, Any]:
    cases = [(claim, tenants) for claim in ("fair", "old") for tenants in (1, 100)]
    per_run: dict[str, list[float]] = {}
    for run in range(args.runs):
        for limit in (8, 1):
            rows = args.rows if limit == 8 else args.rows // 4
            order = cases[run % len(cases) :] + cases[: run % len(cases)]
            for claim, tenants in order:
                with database(admin, template) as name:
                    url = with_database(admin, name)
                    with psycopg.connect(url, autocommit=True) as conn:
                        if claim == "old":
                            for statement in OLD_SCHEMA:
                                conn.execute(statement)
                            conn.execute(_old_claim("ledgerflow.wf_claim_old"))
                        conn.execute(SEED, {"tenants": tenants, "rows": rows})
                        conn.execute("VACUUM ANALYZE ledgerflow.workflow_queue")
                    function = "ledgerflow.wf_claim" if claim == "fair" else "ledgerflow.wf_claim_old"
                    rate = claim_throughput(url, function, args.claimers, limit)
                key = f"{claim} {tenants} tenant{'s' if tenants > 1 else ''} limit {limit}"
                per_run.setdefault(key, []).append(rate)
                print(f"run {run + 1} {key}: {rate:,.0f} nodes/s", flush=True)
    medians = {k: median(v) for k, v in per_run.items()}
    ratios: dict[str, float] = {}
    for limit in (8, 1):
        fair1, fair100 = medians[f"fair 1 tenant limit {limit}"], medians[f"fair 100 tenants limit {limit}"]
        old1, old100 = medians[f"old 1 tenant limit {limit}"], medians[f"old 100 tenants limit {limit}"]
        ratios[f"limit {limit}: fair 1 tenant / old 1 tenant"] = fair1 / old1
        ratios[f"limit {limit}: fair 100 tenants / old 1 tenant"] = fair100 / old1
        ratios[f"limit {limit}: fair 100 tenants / fair 1 tenant"] = fair100 / fair1
        ratios[f"limit {limit}: fair 100 tenants / old 100 tenants"] = fair100 / old100
    return {"nodes_per_second": per_run, "medians": medians, "ratios": ratios}


# -- (b) latency behind a backlog ----------------------------------------------------------------------

LATENCY = """
SELECT s.stream_id,
       extract(epoch FROM min(e.recorded_at) FILTER (WHERE e.event_type = 'wf.NodeClaimed') - s.recorded_at),
       extract(epoch FROM min(e.recorded_at) FILTER (WHERE e.event_type = 'wf.NodeSucceeded') - s.recorded_at)
  FROM ledgerflow.events s
  JOIN ledgerflow.events e ON e.tenant = s.tenant AND e.stream_id = s.stream_id
 WHERE s.tenant = 'b' AND s.event_type = 'wf.RunStarted'
 GROUP BY s.stream_id, s.recorded_at
"""


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def latency_part(admin: str, template: str, args: argparse.Namespace, claim: str) -> dict[str, Any]:
    probes = args.probes if claim == "fair" else 3
    with database(admin, template) as name:
        url = with_database(admin, name)
        if claim == "old":
            with psycopg.connect(url, autocommit=True) as conn:
                for statement in OLD_SCHEMA:
                    conn.execute(statement)
                conn.execute(_old_claim("ledgerflow.wf_claim"))
        with open_store(url=url, migrate=False, name="bench-fair") as store:
            engine = Engine(store, registry)
            for _ in range(args.backlog):
                engine.start("busy", tenant="a")
            env = os.environ | {
                "LEDGERFLOW_DATABASE_URL": url,
                "LEDGERFLOW_WORKFLOWS": "bench.fair_claims:registry",
                "LEDGERFLOW_WORKER_CONCURRENCY": str(args.threads),
                "LEDGERFLOW_LOG_LEVEL": "warning",
                "BENCH_BUSY_MS": str(args.busy_ms),
            }
            # The worker's output, kept after the run for a look when something went wrong.
            log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in the finally below
                prefix=f"fair-worker-{claim}-", suffix=".log", delete=False
            )
            worker = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "worker", "--name", f"fair-{claim}"],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait(lambda: _count(store, "a", "wf.NodeClaimed") > 0, 120, "the worker's first claim")
                for _ in range(probes):
                    engine.start("probe", tenant="b")
                    time.sleep(args.every)
                backlog_left = args.backlog - _count(store, "a", "wf.NodeSucceeded")
                _wait(lambda: _count(store, "b", "wf.NodeSucceeded") >= probes, 600, "B's runs")
            finally:
                worker.terminate()
                worker.wait(timeout=60)
                log.close()
            with store.pool.connection() as conn:
                rows = conn.execute(LATENCY).fetchall()
    claimed = [float(r[1]) for r in rows]
    done = [float(r[2]) for r in rows]
    result = {
        "probes": len(rows),
        "a_backlog_left_after_last_probe": backlog_left,
        "start_to_claimed_s": {"p50": _pct(claimed, 50), "p99": _pct(claimed, 99), "max": max(claimed)},
        "start_to_node_done_s": {"p50": _pct(done, 50), "p99": _pct(done, 99), "max": max(done)},
    }
    print(f"latency ({claim} claim): {json.dumps(result)}", flush=True)
    return result


def _count(store: Any, tenant: str, event_type: str) -> int:
    with store.pool.connection() as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM ledgerflow.events WHERE tenant = %s AND event_type = %s",
            (tenant, event_type),
        ).fetchone() or (0,)
    return int(n)


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def machine() -> dict[str, Any]:
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=default_admin_url())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2_400)
    parser.add_argument("--claimers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=2_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--busy-ms", type=float, default=40)
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--every", type=float, default=0.25)
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    quiet_logs()
    RESULTS.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    load_start = load_average()
    print(f"commit {commit}{' (dirty)' if dirty else ''}; load average {load_start}", flush=True)
    with database(args.url) as template:
        migrate(with_database(args.url, template))
        with psycopg.connect(with_database(args.url, template)) as conn:
            (server,) = conn.execute("SHOW server_version").fetchone() or ("?",)
        results: dict[str, Any] = {"throughput": throughput_part(args.url, template, args)}
        if not args.skip_latency:
            results["latency_fair"] = latency_part(args.url, template, args, "fair")
            results["latency_old"] = latency_part(args.url, template, args, "old")
    report = {
        "benchmark": "fair_claims",
        "commit": commit,
        "dirty": dirty,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**machine(), "postgresql": server},
        "load_average": {"start": load_start, "end": load_average()},
        "settings": vars(args) | {"url": re.sub(r"//[^@]*@", "//", args.url)},
        **results,
    }
    out = RESULTS / f"fair_claims-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(results.get("throughput", {}).get("ratios", {}), indent=2))
    print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

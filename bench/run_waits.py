"""Waiting for a run's end over HTTP (`GET /api/v1/runs/{id}/wait`), against what no wait on the run table
can beat: the projector's own delay.

Run by hand (it is not a test):

    python bench/run_waits.py [--runs 3] [--trials 30] [--burst 20] [--url postgresql://...]

Each run on a fresh database, with the API in this process (a TestClient: no network) and a projector
worker thread following the run tables with its default settings (as `ledgerflow serve` runs one):

  (a) one wait: a run is waited for; once the request waits, the run is cancelled (its end is one commit;
      nothing had run), and the figure is the time from the cancel's return to the answer. The baseline,
      alternating with it in the same run: the time from a cancel's return until the run table shows the
      end, found by looking every millisecond on a connection of its own (the projector's delay).
  (b) a burst: --burst runs are waited for at once, then all cancelled; the time from the last cancel's
      return to the last answer, against the same for the table showing every one of them ended.
  (c) what the waiting requests hold meanwhile: the API pool's connections in use (sampled every
      millisecond for 0.2 s: the listener's looks at the run table, one at a time, take one for a query)
      against the same sampled just before the requests were sent, and the tenant's requests in flight,
      while the burst waits.

Every figure is a median over --runs runs (each the median of its trials); results go to
bench/results/run_waits-<time>.json with the commit and the load average.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient

from bench._common import default_admin_url, fresh_database, load_average, quiet_logs
from eventstore import open_store
from ops.api import create_app
from ops.auth import create_token
from ops.services import Services, open_services
from ops.settings import Settings
from projector import ProjectorWorker, WorkerSettings
from workflows import workflow_tables

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TENANT = "acme"
WORKFLOW = "ontology_extraction"  # the demo's: with no workflow worker, a started run waits


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not come true")
        time.sleep(0.0005)


class Bench:
    def __init__(self, services: Services, client: TestClient, look: psycopg.Connection[Any]) -> None:
        self.services, self.client, self.look = services, client, look
        _, secret = create_token(services.store, tenant=TENANT, scopes=["admin"], name="bench")
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.waiters = client.app.state.waiters  # type: ignore[attr-defined]
        self.in_flight = client.app.state.in_flight  # type: ignore[attr-defined]

    def start(self) -> uuid.UUID:
        return self.services.engine.start(WORKFLOW, input={}, tenant=TENANT).run_id

    def cancel(self, run_id: uuid.UUID) -> None:
        self.services.engine.cancel(run_id, tenant=TENANT, actor="bench")

    def shown_ended(self, run_ids: list[uuid.UUID]) -> bool:
        row = self.look.execute(
            "SELECT count(*) FROM ledgerflow.workflow_runs WHERE run_id = ANY(%s) AND status = 'cancelled'",
            (run_ids,),
        ).fetchone()
        return row is not None and row[0] == len(run_ids)

    def shown(self, run_ids: list[uuid.UUID]) -> None:
        """Until the run table shows the runs (a wait would otherwise begin before the table knows them)."""
        _until(
            lambda: (
                (
                    self.look.execute(
                        "SELECT count(*) FROM ledgerflow.workflow_runs WHERE run_id = ANY(%s)", (run_ids,)
                    ).fetchone()
                    or (0,)
                )[0]
                == len(run_ids)
            )
        )

    def wait_for(self, run_ids: list[uuid.UUID], pool: ThreadPoolExecutor) -> tuple[float, dict[str, int]]:
        """Seconds from the last cancel's return to the last answer, and what was held while they waited."""
        before = self.waiters.waiting
        idle = self.pool_samples()
        answers = [
            pool.submit(
                self.client.get, f"/api/v1/runs/{r}/wait", params={"timeout": 30}, headers=self.headers
            )
            for r in run_ids
        ]
        _until(lambda: self.waiters.waiting == before + len(run_ids))
        waiting = self.pool_samples()
        held = {
            "pool_in_use_idle_median": statistics.median(idle),
            "pool_in_use_idle_max": max(idle),
            "pool_in_use_waiting_median": statistics.median(waiting),
            "pool_in_use_waiting_max": max(waiting),
            "tenant_requests_in_flight": self.in_flight.of(TENANT),
            "waiting": self.waiters.waiting,
        }
        for r in run_ids:
            self.cancel(r)
        ended = time.perf_counter()
        for answer in answers:
            body = answer.result(timeout=60).json()
            assert body["status"] == "cancelled", body
        return time.perf_counter() - ended, held

    def pool_samples(self) -> list[int]:
        """The pool's connections in use, every millisecond for 0.2 s (the listener's looks at the run
        table, one at a time, come and go)."""
        samples = []
        for _ in range(200):
            samples.append(self.pool_in_use())
            time.sleep(0.001)
        return samples

    def pool_in_use(self) -> int:
        stats = self.services.store.pool.get_stats()
        return int(stats.get("pool_size", 0) - stats.get("pool_available", 0))

    def table_shows(self, run_ids: list[uuid.UUID]) -> float:
        for r in run_ids:
            self.cancel(r)
        ended = time.perf_counter()
        _until(lambda: self.shown_ended(run_ids))
        return time.perf_counter() - ended


def one_run(admin_url: str, trials: int, burst: int) -> dict[str, Any]:
    with fresh_database(admin_url, "bench_run_waits") as url:
        services = open_services(Settings(database_url=url, workflows="workflows.demo:registry"))
        # A store of its own, as a projector process has: the API's pool counts the API's requests only.
        projector_store = open_store(url=url, migrate=False)
        projector = ProjectorWorker(projector_store, [workflow_tables], WorkerSettings())
        thread = threading.Thread(target=projector.run, daemon=True)
        thread.start()
        try:
            with (
                TestClient(create_app(services)) as client,
                psycopg.connect(url, autocommit=True) as look,
                ThreadPoolExecutor(burst) as pool,
            ):
                bench = Bench(services, client, look)
                waits, tables = [], []
                for _ in range(trials):
                    a, b = bench.start(), bench.start()
                    bench.shown([a, b])
                    waits.append(bench.wait_for([a], pool)[0])
                    tables.append(bench.table_shows([b]))
                runs = [bench.start() for _ in range(2 * burst)]
                bench.shown(runs)
                burst_wait, held = bench.wait_for(runs[:burst], pool)
                burst_table = bench.table_shows(runs[burst:])
        finally:
            projector.stop()
            thread.join(30)
            projector_store.close()
            services.close()
    wait_ms, table_ms = statistics.median(waits) * 1000, statistics.median(tables) * 1000
    return {
        "one_wait_ms": wait_ms,
        "one_table_ms": table_ms,
        "one_ratio": wait_ms / table_ms,
        "burst_wait_ms": burst_wait * 1000,
        "burst_table_ms": burst_table * 1000,
        "burst_ratio": burst_wait / burst_table,
        "held_while_waiting": held,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=default_admin_url())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--burst", type=int, default=20)
    args = parser.parse_args()
    quiet_logs()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    load_start = load_average()
    results = [one_run(args.url, args.trials, args.burst) for _ in range(args.runs)]
    keys = [k for k in results[0] if k != "held_while_waiting"]
    medians = {k: statistics.median(r[k] for r in results) for k in keys}
    report = {
        "benchmark": "run_waits",
        "commit": commit,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": {"start": load_start, "end": load_average()},
        "settings": vars(args) | {"url": re.sub(r"//[^@]*@", "//", args.url)},
        "medians": medians,
        "runs": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"run_waits-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"medians": medians, "held": [r["held_while_waiting"] for r in results]}, indent=2))
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

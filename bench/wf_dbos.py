"""DBOS Transact's side of the workflow benchmark: the same workflows as steps of DBOS workflows, run in
child processes (`python -m bench.wf_dbos ...`).

DBOS keeps one global instance per process, and the crash drills need a process to kill anyway, so
every DBOS measurement runs in a child: `throughput` measures workload (a) in one process that starts
the workflows and executes them, and exits; `queue-worker` serves DBOS's queue `QUEUE` (its workers in a
process of their own, as a `ledgerflow worker` is) and `queue-start` enqueues into it through a
`DBOSClient` from another process (as the benchmark's process starts ledgerflow's runs); `hold` starts the
blocked workflows and waits to be killed; `serve` relaunches an executor (DBOS recovers its pending
workflows at launch); `takeover` waits for a trigger file, then recovers another executor's workflows
(what DBOS's commercial Conductor would call; nothing in open-source DBOS notices a dead executor).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BackendCpu, machine_cpu_seconds
from bench.wf_marks import _NEVER, BLOCK_SECONDS, ENTER, RETURN, block_if_asked, mark

APP = "ledgerflow-bench"
VERSION = "bench"
WARM_UP_RUNS = 40
#: The queue of the queue set-up, and the name its client enqueues the linear workflow by.
QUEUE = "bench_queue"
LINEAR_NAME = "bench_linear"
# The final write of each workflow; updated_at is when it was made (ms since the epoch).
_LAST_WRITE = "SELECT count(*), max(updated_at) FROM dbos.workflow_status WHERE workflow_uuid = ANY (%s)"


def status() -> str | None:
    """None when DBOS can be measured, else why not."""
    if importlib.util.find_spec("dbos") is None:
        return "not installed (pip install dbos, or pip install -e '.[bench]')"
    return None


def libpq_url(conninfo: str) -> str:
    """A postgresql:// URL for a libpq connection string: DBOS hands its URL to SQLAlchemy, which takes
    URLs only, while bench._common builds key=value strings."""
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(info.get("user", "postgres")), safe="")
    password = f":{quote(str(info['password']), safe='')}" if info.get("password") else ""
    host = info.get("host", "127.0.0.1")
    port = info.get("port", "5432")
    return f"postgresql://{user}{password}@{host}:{port}/{quote(str(info.get('dbname', '')), safe='')}"


def _flows() -> tuple[Any, Any]:
    """The DBOS twins of the ledgerflow workflows: (three trivial steps, a blocking step then one more).
    Defined only in DBOS children, so that the ledgerflow side never imports DBOS."""
    from dbos import DBOS

    def wf_id() -> str:
        return str(DBOS.workflow_id)

    def body(node: str, x: int) -> int:
        mark(wf_id(), node, ENTER)
        mark(wf_id(), node, RETURN)
        return x + 1

    @DBOS.step()
    def step_first(x: int) -> int:
        return body("first", x)

    @DBOS.step()
    def step_second(x: int) -> int:
        return body("second", x)

    @DBOS.step()
    def step_third(x: int) -> int:
        return body("third", x)

    @DBOS.workflow(name=LINEAR_NAME)
    def dbos_linear(x: int) -> int:
        return int(step_third(step_second(step_first(x))))

    @DBOS.step()
    def step_hold(x: int) -> int:
        mark(wf_id(), "hold", ENTER)
        block_if_asked()
        mark(wf_id(), "hold", RETURN)
        return x

    @DBOS.step()
    def step_after_hold(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def dbos_hold(x: int) -> int:
        return int(step_after_hold(step_hold(x)))

    return dbos_linear, dbos_hold


def _throughput(dbos: Any, linear: Any, url: str, count: int, latency_runs: int) -> dict[str, Any]:
    """Warm up; start `count` workflows at once and wait for all; then `latency_runs` one after another.
    The CPU of this process and of the database's backends is taken over the timed window."""
    for h in [dbos.start_workflow(linear, i) for i in range(WARM_UP_RUNS)]:
        h.get_result()
    backends = BackendCpu(url)
    try:
        transactions_before = backends.transactions()
        server_before, client_before = backends.snapshot(), time.process_time()
        machine_before = machine_cpu_seconds()
        started = time.time()
        handles = [dbos.start_workflow(linear, i) for i in range(count)]
        for h in handles:
            h.get_result()
        client = time.process_time() - client_before
        machine = machine_cpu_seconds() - machine_before
        server = BackendCpu.used(server_before, backends.snapshot())
        transactions = backends.transactions() - transactions_before
    finally:
        backends.close()
    ids = [str(h.get_workflow_id()) for h in handles]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_LAST_WRITE, (ids,)).fetchone()
    assert row is not None
    assert int(row[0]) == count
    sequential = []
    for i in range(latency_runs):
        h = dbos.start_workflow(linear, i)
        h.get_result()
        sequential.append(str(h.get_workflow_id()))
    return {
        "seconds": int(row[1]) / 1000 - started,
        "started": started,
        "ids": ids,
        "sequential": sequential,
        "client_cpu": client,
        "server_cpu": server,
        "machine_cpu": machine,
        "transactions": transactions,
    }


def _wait_succeeded(url: str, ids: Sequence[str], timeout: float = 120) -> None:
    """Until every workflow of `ids` succeeded (warm-up only: nothing is measured while this polls)."""
    deadline = time.monotonic() + timeout
    while completed(url, ids)[0] < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids)} warm-up workflows did not complete in {timeout:.0f}s")
        time.sleep(0.05)


def _queue_start(url: str, count: int, latency_runs: int, trigger: Path, out: Path) -> None:
    """The starting process of the queue set-up: a `DBOSClient` (no DBOS launched here, so nothing runs
    here) enqueues the linear workflow into `QUEUE`. Warm-up first; then it writes `out` and waits for
    `trigger`, so that the benchmark takes its CPU readings while nothing is queued; then `count`
    enqueues one after another, timed, and `latency_runs` one after another, each waited for."""
    from dbos import DBOSClient, EnqueueOptions

    client = DBOSClient(system_database_url=url, application_name=APP)
    options: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": LINEAR_NAME, "app_version": VERSION}
    _wait_succeeded(url, [client.enqueue(options, i).get_workflow_id() for i in range(WARM_UP_RUNS)])
    _write(out, {"warm": time.time()})
    while not trigger.exists():
        time.sleep(0.001)
    cpu_before = time.process_time()
    started = time.time()
    ids = [client.enqueue(options, i).get_workflow_id() for i in range(count)]
    enqueued = time.time()
    cpu = time.process_time() - cpu_before
    # Written before the sequential runs, so that the benchmark waits for the last completion meanwhile.
    result: dict[str, Any] = {
        "started": started,
        "enqueued": enqueued,
        "ids": ids,
        "starter_cpu": cpu,
    }
    _write(out.with_suffix(".started.json"), result)
    # The benchmark says when every run completed (nothing here polls the database meanwhile).
    done = trigger.with_suffix(".done")
    while not done.exists():
        time.sleep(0.005)
    sequential = []
    for i in range(latency_runs):
        handle: Any = client.enqueue(options, i)
        handle.get_result(polling_interval_sec=0.01)
        sequential.append(str(handle.get_workflow_id()))
    _write(out, result | {"sequential": sequential})
    client.destroy()


def _write(path: Path, value: dict[str, Any]) -> None:
    """Whole or not at all, for a reader that polls for the file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def child(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode", choices=("throughput", "hold", "serve", "takeover", "queue-worker", "queue-start")
    )
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--executor", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--latency-runs", type=int, default=0)
    parser.add_argument("--trigger", default="")
    parser.add_argument("--recover-from", default="")
    parser.add_argument(
        "--poll", type=float, default=0.05, help="queue-worker: the queue's polling interval, s"
    )
    args = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    if args.mode == "queue-start":
        _queue_start(args.db_url, args.count, args.latency_runs, Path(args.trigger), Path(args.out))
        return 0

    from dbos import DBOS, DBOSConfig

    linear, hold = _flows()
    config: DBOSConfig = {
        "name": APP,
        "system_database_url": args.db_url,
        "log_level": "WARNING",
        # Fixed, so that a relaunched executor recovers the workflows of the killed one (DBOS recovers
        # only workflows of its own application version).
        "application_version": VERSION,
        "executor_id": args.executor,
    }
    DBOS(config=config)
    DBOS.launch()
    out = Path(args.out)
    if args.mode == "throughput":
        out.write_text(json.dumps(_throughput(DBOS, linear, args.db_url, args.count, args.latency_runs)))
        DBOS.destroy()
        return 0
    if args.mode == "queue-worker":
        # No per-executor limit: each poll takes every workflow that is due, as many as DBOS's executor
        # will run at once. Polled every `--poll` seconds (DBOS's default is 1 s).
        DBOS.register_queue(QUEUE, polling_interval_sec=args.poll)
    out.write_text(json.dumps({"launched": time.time()}))
    if args.mode == "hold":
        for i in range(args.count):
            DBOS.start_workflow(hold, i)
    elif args.mode == "takeover":
        trigger = Path(args.trigger)
        while not trigger.exists():
            time.sleep(0.001)
        DBOS._recover_pending_workflows([args.recover_from])
    # `serve` needs nothing more: DBOS.launch() has already started recovering this executor's pending
    # workflows. Every mode now serves until the benchmark ends the process.
    _NEVER.wait(BLOCK_SECONDS)
    return 0


def completed(url: str, ids: Sequence[str]) -> tuple[int, float]:
    """How many of workflows `ids` succeeded, and when the last of them did (s since the epoch); through
    the primary key, as ledgerflow's completions are read through its stream index."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_LAST_WRITE + " AND status = 'SUCCESS'", (list(ids),)).fetchone()
    assert row is not None
    return int(row[0]), (int(row[1]) / 1000 if row[1] is not None else 0.0)


if __name__ == "__main__":
    sys.exit(child())

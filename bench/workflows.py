"""Workflow throughput, per-node overhead, hand-off and crash recovery of ledgerflow, beside DBOS Transact.

Run by hand (it is not a test):

    python bench/workflows.py [--runs 3] [--url postgresql://postgres@127.0.0.1:5432/postgres]

Five workloads, each measured for every system in every run, each system on its own fresh database:

  (a) a linear workflow of three trivial nodes (DBOS: a workflow of three trivial steps), 500 runs started at
      once from one thread: workflows/s from the first start to the last completion. ledgerflow runs in
      `ledgerflow worker` processes (exactly 1, then exactly `--procs`, each with `--threads` node threads)
      while this process starts the runs. DBOS twice: in one process that starts the workflows and executes
      them (its default executor), and in ledgerflow's shape, a worker process serving a DBOS queue (polled
      every `--dbos-poll` seconds) that another process enqueues into through a `DBOSClient`; the ratio to
      that second set-up is the headline. CPU over the same window: the worker processes, the starting process
      and the database's backends, from /proc, per workflow, and how busy that keeps the machine's CPUs
      ("where the limit is"). Then `--latency-runs` runs one after another with nothing else queued, for the
      per-node overhead (one body's entry to the next's) and the hand-off (one body's return to the next
      body's entry: recording the success, readying and claiming the successor, loading the run, starting the
      body), for ledgerflow also split at the start of the transaction recording the success (its
      NodeSucceeded's recorded_at, read after the measurement). Hand-offs are also reported under the 500-run
      load.
  (b) 1,000 runs in flight, each blocked in its first node; the worker process is SIGKILLed and a new one
      with the same name (DBOS: the same executor id) is spawned. Measured from the new process's spawn:
      until the first and until all 1,000 first nodes run again in it, and until all runs completed.
  (c) the same, but nobody restarts the dead worker: another worker, already running under another name,
      takes its nodes over. Measured from the kill. DBOS: a running executor is told at the kill to
      recover the dead one's workflows (`DBOS._recover_pending_workflows`, what its Conductor calls).
      ledgerflow runs with its default lease TTL, heartbeat and recovery interval unless told otherwise.
  (d) scaling where the machine is not the limit: the workflow of (a), but each body waits `--wait-ms`
      (as a call to a model provider does, without CPU), 500 runs at once, on exactly 1 and then exactly
      `--procs` worker processes of `--threads` node threads each. One process is then bound by its node
      threads, not by CPU, so the ratio says whether anything shared (the claim, the queue's rows, the
      log's writer lock) serialises the workers. ledgerflow only: DBOS runs its workflows in the process
      that starts them.
  (e) the workers alone: the workflow of (a), 500 runs started in one transaction before the window, so
      that they become ready at once when it commits; from that commit to the last completion, on exactly
      1 and then exactly `--procs` worker processes. In (a) this process starts the runs one after another
      while the workers run them, and the share of the window those starts took is printed: near 100%,
      they set the pace. ledgerflow only.

"Running again" and node timings come from the node (step) bodies themselves (bench/wf_marks.py): the
same instrument for both systems, no polling delay. Completion is waited for without loading the database
while the work runs: first the third bodies' notes, then each system's own record of completion read
through an index (ledgerflow: the runs' RunCompleted events by stream; DBOS: workflow_status by primary
key); the time of completion is that record's own timestamp (ledgerflow: the appending transaction's
start; DBOS: its final write), on this machine's clock.

Results are printed and written to bench/results/workflows-<UTC time>.json with the commit and the
machine's load average before and after each run.

Every worker's log is scanned after each scenario; warnings are counted and `workflow_lease_lost` lines
printed: a clean run (workload a) must have none.

Absolute numbers on a shared 2-core machine drift by more than the differences that matter, so every
number is a median over runs, ratios are taken per run between systems measured minutes apart at most (in
rotating order), and the per-run values are printed too.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import structlog

if __package__ in (None, ""):
    # Run as `python bench/workflows.py`: make the repository root importable so that `bench._common`
    # resolves, and so that worker subprocesses can import this file as `bench.workflows`.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import wf_dbos
from bench._common import (
    BackendCpu,
    default_admin_url,
    fmt_ratio,
    fresh_database,
    load_average,
    machine_cpu_seconds,
    median,
    print_table,
    process_cpu_seconds,
    process_shape,
)
from bench.wf_marks import ENTER, RETURN, MarkLog, block_if_asked, mark, node_gaps, pct
from eventstore import DatabaseSettings, EventStore, open_store
from eventstore.migrate import migrate
from ops.settings import Settings as OpsSettings
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry
from workflows import events as ev

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# -- the workflows ----------------------------------------------------------------------------------
#
# Importable by worker subprocesses as `bench.workflows:registry`. Node bodies do nothing but note when
# they were entered and when they return, so that everything measured is the engine's own cost.

registry = WorkflowRegistry()
LINEAR = "bench_linear"
HOLD = "bench_hold"
LINEAR_NODES = ("first", "second", "third")

linear = Workflow(LINEAR)


def _body(ctx: NodeContext, node: str, value: int) -> int:
    mark(str(ctx.run_id), node, ENTER)
    mark(str(ctx.run_id), node, RETURN)
    return value


@linear.node()
def first(ctx: NodeContext) -> int:
    return _body(ctx, "first", 1)


@linear.node(depends_on=["first"])
def second(ctx: NodeContext) -> int:
    return _body(ctx, "second", 2)


@linear.node(depends_on=["second"])
def third(ctx: NodeContext) -> int:
    return _body(ctx, "third", 3)


registry.register(linear)

hold_flow = Workflow(HOLD)


@hold_flow.node()
def hold(ctx: NodeContext) -> int:
    mark(str(ctx.run_id), "hold", ENTER)
    block_if_asked()
    mark(str(ctx.run_id), "hold", RETURN)
    return 1


@hold_flow.node(depends_on=["hold"])
def after_hold(ctx: NodeContext) -> int:
    return 2


registry.register(hold_flow)

WAITING = "bench_waiting"
waiting_flow = Workflow(WAITING)


def _waiting_body(ctx: NodeContext, node: str, value: int) -> int:
    mark(str(ctx.run_id), node, ENTER)
    time.sleep(float(os.environ.get("BENCH_WAIT_MS", "0")) / 1000)
    mark(str(ctx.run_id), node, RETURN)
    return value


# The same node names as the linear workflow's, so that the same notes time both.
@waiting_flow.node(name="first")
def waiting_first(ctx: NodeContext) -> int:
    return _waiting_body(ctx, "first", 1)


@waiting_flow.node(name="second", depends_on=["first"])
def waiting_second(ctx: NodeContext) -> int:
    return _waiting_body(ctx, "second", 2)


@waiting_flow.node(name="third", depends_on=["second"])
def waiting_third(ctx: NodeContext) -> int:
    return _waiting_body(ctx, "third", 3)


registry.register(waiting_flow)


# -- settings ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    url: str
    workflows: int  # (a) runs started at once
    latency_runs: int  # (a) runs one after another, for the per-node overhead
    procs: int  # (a), (d), (e) worker processes of the scaled-out measurement
    threads: int  # (a), (d), (e) node threads of each worker process
    wait_ms: float  # (d) how long each body waits
    in_flight: int  # (b), (c) runs blocked in their first node when the worker dies
    lease_ttl: float | None  # None: the product's default
    heartbeat: float | None
    recovery_interval: float | None
    with_dbos: bool
    dbos_poll: float = 0.05  # (a) the DBOS queue's polling interval, s
    systems: tuple[str, ...] = ()  # only these systems' keys (lf1, lf2, dbos, dbosq, lf); empty: all

    def effective(self) -> tuple[float, float, float]:
        """(lease TTL, heartbeat, recovery interval) as the workers run them."""
        fields = OpsSettings.model_fields
        return (
            self.lease_ttl or float(fields["workflow_lease_ttl"].default),
            self.heartbeat or float(fields["workflow_heartbeat_interval"].default),
            self.recovery_interval or float(fields["recovery_interval"].default),
        )


WARM_UP_RUNS = wf_dbos.WARM_UP_RUNS
POLL = 0.02  # seconds between looks at the notes of the bodies (files on this machine, not the database)
CORES = os.cpu_count() or 1


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    procs: Sequence[subprocess.Popen[bytes]] = (),
    interval: float = POLL,
) -> T:
    """Poll `condition` until it returns something truthy; fail fast when a process it relies on died."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(
                    f"a process died (exit {p.returncode}) while waiting for {what}: {last_words(p)}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- processes and their logs ------------------------------------------------------------------------

#: Where each subprocess writes its output, so that the reason it died can be reported.
LOGS: dict[int, Path] = {}


def last_words(p: subprocess.Popen[bytes]) -> str:
    """The last line of a dead subprocess's output that says what went wrong."""
    path = LOGS.get(p.pid)
    if path is None or not path.exists():
        return "no output"
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or '"error"' in ln or "FATAL" in ln]
    return (errors or lines or ["no output"])[-1][:300]


class Processes:
    """Every subprocess a scenario starts, ended (by its own pid) when the scenario ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, args: Sequence[str], env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
        path = self.log_dir / f"{log_name}-{uuid.uuid4().hex[:6]}.log"  # one file per process
        with path.open("ab") as out:
            p = subprocess.Popen(
                list(args), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started.append(p)
        LOGS[p.pid] = path
        return p

    def logs(self) -> list[Path]:
        return [LOGS[p.pid] for p in self.started]

    def close(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.started:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()


def kill(p: subprocess.Popen[bytes]) -> float:
    """SIGKILL a process of ours and reap it; returns when the kill was sent."""
    at = time.time()
    p.send_signal(signal.SIGKILL)
    p.wait()
    return at


@dataclass
class LogFindings:
    """Warnings and errors in the workers' logs of one scenario."""

    counts: Counter[str] = field(default_factory=Counter)
    lease_lost: list[str] = field(default_factory=list)  # the lines themselves

    def merge(self, other: LogFindings) -> None:
        self.counts.update(other.counts)
        self.lease_lost.extend(other.lease_lost)


def scan_logs(paths: Sequence[Path]) -> LogFindings:
    """Count warning and error lines by event; keep the `workflow_lease_lost` lines. Lines that are not
    JSON (a traceback, say) are counted as such."""
    found = LogFindings()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                found.counts["(not JSON)"] += 1
                continue
            if not isinstance(entry, dict) or entry.get("level") not in ("warning", "error", "critical"):
                continue
            event = str(entry.get("event"))
            found.counts[f"{entry.get('level')}: {event}"] += 1
            if "lease_lost" in event:
                found.lease_lost.append(line)
    return found


# -- ledgerflow ------------------------------------------------------------------------------------

# Each run's last event, one entry of the (tenant, stream_id, stream_version) unique index per run, never
# a scan of the log; asked only once the bodies' notes say the runs are at their end.
COMPLETED = """
SELECT count(*) FILTER (WHERE last.event_type = %(type)s),
       extract(epoch FROM max(last.recorded_at) FILTER (WHERE last.event_type = %(type)s))::float8
  FROM unnest(%(streams)s::text[]) AS s(stream_id)
 CROSS JOIN LATERAL (
       SELECT e.event_type, e.recorded_at FROM ledgerflow.events e
        WHERE e.tenant = 'default' AND e.stream_id = s.stream_id
        ORDER BY e.stream_version DESC LIMIT 1) AS last
"""
STARTUP_SWEEP = """
SELECT extract(epoch FROM started_at)::float8, duration_ms, found
  FROM ledgerflow.workflow_recoveries WHERE worker LIKE %(name)s || '/%%' AND trigger = 'startup'
"""


def lf_completed(store: EventStore, run_ids: Sequence[uuid.UUID]) -> tuple[int, float]:
    with store.pool.connection() as conn:
        row = conn.execute(
            COMPLETED, {"streams": [ev.run_stream(r) for r in run_ids], "type": ev.RUN_COMPLETED}
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1] or 0.0)


def lf_wait_done(
    store: EventStore,
    marks: MarkLog,
    run_ids: Sequence[uuid.UUID],
    last_node: str,
    procs: Sequence[subprocess.Popen[bytes]],
    timeout: float = 300,
) -> float:
    """Wait until every run in `run_ids` completed; return when the last one did (server time). The
    database is asked only once every run's last body has returned."""
    ids = {str(r) for r in run_ids}
    wait_for(
        lambda: ids <= marks.update().entered(last_node, phase=RETURN).keys(),
        timeout=timeout,
        what=f"{len(ids)} runs to reach their last node",
        procs=procs,
    )

    def done() -> float | None:
        n, last = lf_completed(store, run_ids)
        return last if n >= len(run_ids) else None

    return wait_for(done, timeout=60, what=f"{len(ids)} completed runs", procs=procs, interval=0.005)


def lf_open(url: str, pool: int) -> EventStore:
    settings = DatabaseSettings(database_url=url, pool_min_size=pool, pool_max_size=pool)
    return open_store(settings, url=url, migrate=False, name="bench-ledgerflow")


def lf_start(engine: Engine, workflow: str, count: int) -> list[uuid.UUID]:
    return [engine.start(workflow).run_id for _ in range(count)]


def lf_start_untimed(engine: Engine, workflow: str, count: int, threads: int = 4) -> list[uuid.UUID]:
    """Start runs from a few threads: for set-up that is not measured, only waited for."""
    with ThreadPoolExecutor(threads) as pool:
        futures = [
            pool.submit(lf_start, engine, workflow, count // threads + (i < count % threads))
            for i in range(threads)
        ]
        return [r for f in futures for r in f.result()]


def lf_worker(
    procs: Processes, url: str, s: Settings, name: str, *, concurrency: int, block: bool, mark_dir: Path
) -> subprocess.Popen[bytes]:
    """One `ledgerflow worker` process, as a deployment runs it: its pool at the default size (1 to 10
    connections, shared by the claim loop, heartbeats and every node thread)."""
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "bench.workflows:registry",
        "LEDGERFLOW_WORKER_CONCURRENCY": str(concurrency),
        # Warnings only, as JSON to the log file, which is scanned afterwards.
        "LEDGERFLOW_LOG_LEVEL": "warning",
        "LEDGERFLOW_LOG_FORMAT": "json",
        "BENCH_BLOCK": "1" if block else "0",
        "BENCH_MARK_DIR": str(mark_dir),
        "BENCH_WAIT_MS": str(s.wait_ms),
    }
    for var, value in (
        ("LEDGERFLOW_WORKFLOW_LEASE_TTL", s.lease_ttl),
        ("LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL", s.heartbeat),
        ("LEDGERFLOW_RECOVERY_INTERVAL", s.recovery_interval),
    ):
        if value is not None:
            env[var] = str(value)
    return procs.start([sys.executable, "-m", "ops.cli", "worker", "--name", name], env, name)


def lf_wait_ready(store: EventStore, name: str, p: subprocess.Popen[bytes]) -> None:
    """A worker has swept at start-up (recorded in workflow_recoveries) and is about to claim."""

    def swept() -> bool:
        with store.pool.connection() as conn:
            return conn.execute(STARTUP_SWEEP, {"name": name}).fetchone() is not None

    wait_for(swept, timeout=60, what=f"worker {name} to start", procs=[p], interval=0.05)


@dataclass
class Throughput:
    seconds: float  # first start to last completion
    count: int
    load_overheads: list[float]  # under the load: body entry to the next body's entry
    load_handoffs: list[float]  # under the load: body return to the next body's entry
    worker_cpu: float  # CPU seconds of the executing processes over the window (DBOS: its one process)
    starter_cpu: float | None  # CPU seconds of the process starting the runs (DBOS: the same process)
    server_cpu: float  # CPU seconds of the database's backends over the window
    machine_cpu: float = 0.0  # CPU seconds every process of the machine spent over the window
    transactions: int | None = None  # the database's transactions over the window (and a second after)
    #: ledgerflow, runs one after another: the hand-off split at the success transaction's start
    success_begins: list[float] = field(default_factory=list)
    success_to_next: list[float] = field(default_factory=list)
    #: (threads, child processes) of each executing process at the end of the window
    shapes: list[tuple[int, int]] = field(default_factory=list)
    #: ledgerflow: seconds from the first start to the last start's return (this process starts them all)
    starting: float | None = None
    overheads: list[float] = field(default_factory=list)  # runs one after another
    handoffs: list[float] = field(default_factory=list)
    run: int = -1  # ratios are taken between systems measured in the same run

    @property
    def wfps(self) -> float:
        return self.count / self.seconds

    def per_workflow_ms(self, cpu: float | None) -> float:
        return 0.0 if cpu is None else cpu / self.count * 1000

    @property
    def ours(self) -> float:
        return self.worker_cpu + (self.starter_cpu or 0.0) + self.server_cpu

    @property
    def busy(self) -> float:
        """Share of the machine's CPUs that the measured work kept busy (client processes and server)."""
        return self.ours / (self.seconds * CORES)

    @property
    def others(self) -> float:
        """Share of the machine's CPUs that everything else (other tenants of the machine) used meanwhile."""
        return max(0.0, self.machine_cpu - self.ours) / (self.seconds * CORES)


def lf_sequential(
    engine: Engine, marks: MarkLog, s: Settings, procs: Sequence[subprocess.Popen[bytes]]
) -> list[uuid.UUID]:
    """Runs one after another, nothing else queued: each started once the previous one completed."""
    ids = []
    for _ in range(s.latency_runs):
        run_id = engine.start(LINEAR).run_id
        lf_wait_one(engine, marks, run_id, procs)
        ids.append(run_id)
    return ids


# Read after the measurement: when each node's success was recorded (the recording transaction's start).
SUCCEEDED = """
SELECT stream_id, data->>'node', extract(epoch FROM recorded_at)::float8
  FROM ledgerflow.events
 WHERE tenant = 'default' AND stream_id = ANY (%(streams)s) AND event_type = %(type)s
"""


def lf_handoff_split(
    store: EventStore, marks: MarkLog, run_ids: Sequence[uuid.UUID]
) -> tuple[list[float], list[float]]:
    """The hand-off in two: (body return to the start of the transaction recording its success, that
    start to the next body's entry). The first part is the worker's own work before it writes; the
    second is the recording transaction, the successor's claim, loading the run and starting the body."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            SUCCEEDED, {"streams": [ev.run_stream(r) for r in run_ids], "type": ev.NODE_SUCCEEDED}
        ).fetchall()
    recorded = {(stream, node): float(at) for stream, node, at in rows}
    times = marks.update().by_run()
    before: list[float] = []
    after: list[float] = []
    for r in run_ids:
        for prev, nxt in itertools.pairwise(LINEAR_NODES):
            returned = times.get((str(r), prev, RETURN))
            began = recorded.get((ev.run_stream(r), prev))
            entered = times.get((str(r), nxt, ENTER))
            if returned is not None and began is not None and entered is not None:
                before.append(began - returned)
                after.append(entered - began)
    return before, after


def lf_wait_one(
    engine: Engine, marks: MarkLog, run_id: uuid.UUID, procs: Sequence[subprocess.Popen[bytes]]
) -> None:
    """The bodies' notes first (no database load while the measured nodes run), then the run's last event."""
    key = str(run_id)
    wait_for(
        lambda: key in marks.update().entered("third", phase=RETURN),
        timeout=30,
        what="a run's third node",
        procs=procs,
        interval=0.001,
    )

    def ended() -> bool:
        last = engine.store.read_stream(ev.run_stream(run_id), backward=True, limit=1)
        return bool(last) and last[0].type == ev.RUN_COMPLETED

    wait_for(ended, timeout=30, what="a run's end", procs=procs, interval=0.002)


def lf_throughput(
    url: str,
    s: Settings,
    log_dir: Path,
    nprocs: int,
    sequential: bool,
    workflow: str = LINEAR,
    ready_at_once: bool = False,
) -> tuple[Throughput, LogFindings]:
    """(a), (d), (e): `workflow` on exactly `nprocs` `ledgerflow worker` processes of `s.threads` node
    threads each. `ready_at_once` (e): the runs are started in one transaction before the window, which
    opens as it commits."""
    mark_dir = Path(tempfile.mkdtemp(dir=log_dir, prefix=f"lf-a{nprocs}-"))
    marks = MarkLog(mark_dir)
    procs = Processes(log_dir)
    with ExitStack() as stack:
        stack.callback(procs.close)
        store = lf_open(url, 2)
        stack.callback(store.close)
        engine = Engine(store, registry)
        workers = [
            lf_worker(procs, url, s, f"bench-w{i + 1}", concurrency=s.threads, block=False, mark_dir=mark_dir)
            for i in range(nprocs)
        ]
        for i, p in enumerate(workers):
            lf_wait_ready(store, f"bench-w{i + 1}", p)
        # Warm-up: every connection of every pool runs every statement a few times (psycopg prepares
        # statements after 5 executions; PostgreSQL caches the plpgsql functions' plans per connection).
        lf_wait_done(store, marks, lf_start(engine, workflow, WARM_UP_RUNS), "third", workers)

        pending: psycopg.Connection[Any] | None = None
        if ready_at_once:
            pending = stack.enter_context(psycopg.connect(url))
            # A statement first, so that the transaction is open: each start is then a savepoint in it
            # (psycopg commits a `transaction()` block that opened the transaction itself).
            pending.execute("SELECT pg_current_xact_id()")
            run_ids = [engine.start(workflow, conn=pending).run_id for _ in range(s.workflows)]

        backends = BackendCpu(url)
        stack.callback(backends.close)
        transactions_before = backends.transactions()
        server_before = backends.snapshot()
        workers_before = [process_cpu_seconds(p.pid) or 0.0 for p in workers]
        starter_before = time.process_time()
        machine_before = machine_cpu_seconds()
        started = time.time()
        if pending is not None:
            pending.commit()
            store.notify_appended()
        else:
            run_ids = lf_start(engine, workflow, s.workflows)
        starting = time.time() - started
        last = lf_wait_done(store, marks, run_ids, "third", workers)
        starter = time.process_time() - starter_before
        machine = machine_cpu_seconds() - machine_before
        worker_cpu = sum(
            (process_cpu_seconds(p.pid) or 0.0) - b for p, b in zip(workers, workers_before, strict=True)
        )
        server = BackendCpu.used(server_before, backends.snapshot())
        shapes = [process_shape(p.pid) for p in workers]
        transactions = backends.transactions() - transactions_before

        load_overheads, load_handoffs = node_gaps(marks, [str(r) for r in run_ids], LINEAR_NODES)
        result = Throughput(
            last - started, s.workflows, load_overheads, load_handoffs, worker_cpu, starter, server, machine
        )
        result.transactions = transactions
        result.shapes = shapes
        result.starting = starting
        if sequential:
            seq_ids = lf_sequential(engine, marks, s, workers)
            result.overheads, result.handoffs = node_gaps(marks, [str(r) for r in seq_ids], LINEAR_NODES)
            result.success_begins, result.success_to_next = lf_handoff_split(store, marks, seq_ids)
    return result, scan_logs(procs.logs())


def lf_procs(
    nprocs: Callable[[Settings], int], **how: Any
) -> Callable[[str, Settings, Path], tuple[Throughput, LogFindings]]:
    """A measure of `lf_throughput` on `nprocs(s)` worker processes, with its other arguments `how`."""
    return lambda url, s, log_dir: lf_throughput(url, s, log_dir, nprocs(s), **how)


def _one(s: Settings) -> int:
    return 1


def _many(s: Settings) -> int:
    return s.procs


lf_one = lf_procs(_one, sequential=True)
lf_many = lf_procs(_many, sequential=False)
lf_one_waiting = lf_procs(_one, sequential=False, workflow=WAITING)
lf_many_waiting = lf_procs(_many, sequential=False, workflow=WAITING)
lf_one_ready = lf_procs(_one, sequential=False, ready_at_once=True)
lf_many_ready = lf_procs(_many, sequential=False, ready_at_once=True)


@dataclass
class Recovery:
    first: float  # seconds from the origin until the first blocked node ran again elsewhere
    all_running: float  # ... until every one did
    completed: float  # ... until every run completed
    spawn_after_kill: float | None = None  # (b): when the new process was spawned, after the kill
    sweep_ms: float | None = None  # (b) ledgerflow: the start-up sweep's own duration
    boot: float | None = None  # (b) ledgerflow: spawn until the start-up sweep began (imports, connecting)
    run: int = -1  # ratios are taken between systems measured in the same run


def lf_hold_runs(
    store: EventStore, s: Settings, procs: Processes, marks: MarkLog, name: str
) -> tuple[subprocess.Popen[bytes], list[uuid.UUID]]:
    """A worker of concurrency `s.in_flight` with `s.in_flight` runs blocked in their first node."""
    worker = lf_worker(
        procs, store.url, s, name, concurrency=s.in_flight, block=True, mark_dir=marks.directory
    )
    lf_wait_ready(store, name, worker)
    run_ids = lf_start_untimed(Engine(store, registry), HOLD, s.in_flight)
    wait_for(
        lambda: marks.update().count("hold", worker.pid) >= s.in_flight,
        timeout=180,
        what=f"{s.in_flight} blocked first nodes",
        procs=[worker],
    )
    return worker, run_ids


def running_again(marks: MarkLog, p: subprocess.Popen[bytes], count: int, what: str) -> tuple[float, float]:
    """(first, last) entry time of the blocked node in process `p`, once all `count` runs entered it."""

    def all_in() -> tuple[float, float] | None:
        entered = marks.update().entered("hold", p.pid)
        return (min(entered.values()), max(entered.values())) if len(entered) >= count else None

    return wait_for(all_in, timeout=180, what=what, procs=[p])


def lf_restart(url: str, s: Settings, log_dir: Path) -> tuple[Recovery, LogFindings]:
    """(b): SIGKILL the worker; spawn one with the same name, which takes its nodes back at start-up."""
    marks = MarkLog(Path(tempfile.mkdtemp(dir=log_dir, prefix="lf-b-")))
    procs = Processes(log_dir)
    with ExitStack() as stack:
        stack.callback(procs.close)
        store = lf_open(url, 2)
        stack.callback(store.close)
        name = "bench-restart"
        old, run_ids = lf_hold_runs(store, s, procs, marks, name)
        killed = kill(old)
        spawned = time.time()
        new = lf_worker(procs, url, s, name, concurrency=s.in_flight, block=False, mark_dir=marks.directory)
        first_at, all_at = running_again(marks, new, s.in_flight, "the first nodes to run again")
        done = lf_wait_done(store, marks, run_ids, "hold", [new])
        # Both processes recorded a start-up sweep; the new one's is the later.
        with store.pool.connection() as conn:
            row = conn.execute(STARTUP_SWEEP + " ORDER BY started_at DESC LIMIT 1", {"name": name}).fetchone()
        recovery = Recovery(
            first_at - spawned,
            all_at - spawned,
            done - spawned,
            spawn_after_kill=spawned - killed,
            sweep_ms=None if row is None else float(row[1]),
            boot=None if row is None else float(row[0]) - spawned,
        )
    return recovery, scan_logs(procs.logs())


def lf_takeover(url: str, s: Settings, log_dir: Path) -> tuple[Recovery, LogFindings]:
    """(c): SIGKILL the worker; another, already running, takes its nodes over."""
    marks = MarkLog(Path(tempfile.mkdtemp(dir=log_dir, prefix="lf-c-")))
    procs = Processes(log_dir)
    with ExitStack() as stack:
        stack.callback(procs.close)
        store = lf_open(url, 2)
        stack.callback(store.close)
        old, run_ids = lf_hold_runs(store, s, procs, marks, "bench-dies")
        # Started only now, so that it cannot claim the runs before the first worker does.
        other = lf_worker(
            procs, url, s, "bench-other", concurrency=s.in_flight, block=False, mark_dir=marks.directory
        )
        lf_wait_ready(store, "bench-other", other)
        killed = kill(old)
        first_at, all_at = running_again(
            marks, other, s.in_flight, "the first nodes to run on the other worker"
        )
        done = lf_wait_done(store, marks, run_ids, "hold", [other])
        recovery = Recovery(first_at - killed, all_at - killed, done - killed)
    return recovery, scan_logs(procs.logs())


# -- DBOS (bench/wf_dbos.py runs in child processes) ------------------------------------------------


def dbos_child(
    procs: Processes,
    url: str,
    mode: str,
    out: Path,
    *,
    executor: str,
    block: bool,
    mark_dir: Path,
    count: int = 0,
    latency_runs: int = 0,
    trigger: Path | None = None,
    recover_from: str = "",
    poll: float = 0.05,
) -> subprocess.Popen[bytes]:
    env = os.environ | {"BENCH_BLOCK": "1" if block else "0", "BENCH_MARK_DIR": str(mark_dir)}
    args = [
        sys.executable,
        "-m",
        "bench.wf_dbos",
        mode,
        "--db-url",
        wf_dbos.libpq_url(url),
        "--executor",
        executor,
        "--out",
        str(out),
        "--count",
        str(count),
        "--latency-runs",
        str(latency_runs),
        "--trigger",
        str(trigger or ""),
        "--recover-from",
        recover_from,
        "--poll",
        str(poll),
    ]
    return procs.start(args, env, f"dbos-{mode}-{executor}")


def dbos_throughput(url: str, s: Settings, log_dir: Path) -> tuple[Throughput, LogFindings]:
    mark_dir = Path(tempfile.mkdtemp(dir=log_dir, prefix="dbos-a-"))
    out = mark_dir / "result.json"
    procs = Processes(log_dir)
    try:
        p = dbos_child(
            procs,
            url,
            "throughput",
            out,
            executor="bench-a",
            block=False,
            mark_dir=mark_dir,
            count=s.workflows,
            latency_runs=s.latency_runs,
        )
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"the DBOS child failed (exit {p.returncode}): {last_words(p)}")
    finally:
        procs.close()
    got = json.loads(out.read_text())
    marks = MarkLog(mark_dir).update()
    load_overheads, load_handoffs = node_gaps(marks, got["ids"], LINEAR_NODES)
    result = Throughput(
        float(got["seconds"]),
        s.workflows,
        load_overheads,
        load_handoffs,
        float(got["client_cpu"]),
        None,  # the same process starts and executes
        float(got["server_cpu"]),
        float(got["machine_cpu"]),
    )
    result.transactions = int(got["transactions"])
    result.overheads, result.handoffs = node_gaps(marks, got["sequential"], LINEAR_NODES)
    return result, LogFindings()


def dbos_queue_throughput(url: str, s: Settings, log_dir: Path) -> tuple[Throughput, LogFindings]:
    """(a) for DBOS with its workers in a process of their own, the shape of ledgerflow's: a launched DBOS
    process serves a queue (bench/wf_dbos.py `queue-worker`), another process enqueues into it through a
    `DBOSClient` (`queue-start`). The window runs from the first enqueue to the last completion; CPU is
    the worker process's, the starting process's (its enqueues, and this process watching for the end,
    as for ledgerflow) and the database's backends'."""
    mark_dir = Path(tempfile.mkdtemp(dir=log_dir, prefix="dbosq-a-"))
    out, trigger = mark_dir / "start.json", mark_dir / "go"
    started_file = out.with_suffix(".started.json")
    marks = MarkLog(mark_dir)
    procs = Processes(log_dir)
    with ExitStack() as stack:
        stack.callback(procs.close)
        worker = dbos_child(
            procs,
            url,
            "queue-worker",
            mark_dir / "worker.json",
            executor="bench-queue",
            block=False,
            mark_dir=mark_dir,
            poll=s.dbos_poll,
        )
        wait_for((mark_dir / "worker.json").exists, timeout=60, what="the DBOS queue worker", procs=[worker])
        starter = dbos_child(
            procs,
            url,
            "queue-start",
            out,
            executor="bench-queue-start",
            block=False,
            mark_dir=mark_dir,
            count=s.workflows,
            latency_runs=s.latency_runs,
            trigger=trigger,
        )
        wait_for(out.exists, timeout=120, what="the DBOS warm-up", procs=[worker, starter])
        backends = BackendCpu(url)
        stack.callback(backends.close)
        transactions_before = backends.transactions()
        server_before = backends.snapshot()
        worker_before = process_cpu_seconds(worker.pid) or 0.0
        watcher_before = time.process_time()
        machine_before = machine_cpu_seconds()
        trigger.touch()
        got = wait_for(
            lambda: json.loads(started_file.read_text()) if started_file.exists() else None,
            timeout=300,
            what="the DBOS enqueues",
            procs=[worker, starter],
        )
        ids = [str(i) for i in got["ids"]]
        wait_for(
            lambda: set(ids) <= marks.update().entered("third", phase=RETURN).keys(),
            timeout=300,
            what=f"{len(ids)} DBOS workflows to reach their last step",
            procs=[worker],
        )

        def done() -> float | None:
            n, last = wf_dbos.completed(url, ids)
            return last if n >= len(ids) else None

        last = wait_for(
            done, timeout=60, what="the DBOS workflows' completion", procs=[worker], interval=0.005
        )
        watcher = time.process_time() - watcher_before
        machine = machine_cpu_seconds() - machine_before
        worker_cpu = (process_cpu_seconds(worker.pid) or 0.0) - worker_before
        server = BackendCpu.used(server_before, backends.snapshot())
        shapes = [process_shape(worker.pid)]
        transactions = backends.transactions() - transactions_before
        trigger.with_suffix(".done").touch()
        if starter.wait(timeout=600) != 0:
            raise RuntimeError(f"the DBOS starter failed (exit {starter.returncode}): {last_words(starter)}")
        sequential = [str(i) for i in json.loads(out.read_text())["sequential"]]
    marks.update()
    load_overheads, load_handoffs = node_gaps(marks, ids, LINEAR_NODES)
    result = Throughput(
        last - float(got["started"]),
        s.workflows,
        load_overheads,
        load_handoffs,
        worker_cpu,
        float(got["starter_cpu"]) + watcher,
        server,
        machine,
    )
    result.transactions = transactions
    result.shapes = shapes
    result.starting = float(got["enqueued"]) - float(got["started"])
    result.overheads, result.handoffs = node_gaps(marks, sequential, LINEAR_NODES)
    return result, LogFindings()


def dbos_hold(
    procs: Processes, url: str, s: Settings, marks: MarkLog, executor: str
) -> subprocess.Popen[bytes]:
    out = marks.directory / f"hold-{executor}.json"
    p = dbos_child(
        procs, url, "hold", out, executor=executor, block=True, mark_dir=marks.directory, count=s.in_flight
    )
    wait_for(
        lambda: marks.update().count("hold", p.pid) >= s.in_flight,
        timeout=180,
        what=f"{s.in_flight} blocked DBOS steps",
        procs=[p],
    )
    return p


def dbos_wait_done(url: str, marks: MarkLog, p: subprocess.Popen[bytes], count: int) -> float:
    ids = list(marks.entered("hold", p.pid))

    def done() -> float | None:
        n, last = wf_dbos.completed(url, ids)
        return last if n >= count else None

    return wait_for(done, timeout=300, what=f"{count} completed DBOS workflows", procs=[p], interval=0.05)


def dbos_restart(url: str, s: Settings, log_dir: Path) -> tuple[Recovery, LogFindings]:
    """(b) for DBOS: SIGKILL the executor's process and launch it again with the same executor id."""
    marks = MarkLog(Path(tempfile.mkdtemp(dir=log_dir, prefix="dbos-b-")))
    procs = Processes(log_dir)
    try:
        old = dbos_hold(procs, url, s, marks, "bench-exec")
        killed = kill(old)
        spawned = time.time()
        new = dbos_child(
            procs,
            url,
            "serve",
            marks.directory / "serve.json",
            executor="bench-exec",
            block=False,
            mark_dir=marks.directory,
        )
        first_at, all_at = running_again(marks, new, s.in_flight, "the DBOS steps to run again")
        done = dbos_wait_done(url, marks, new, s.in_flight)
        return Recovery(
            first_at - spawned, all_at - spawned, done - spawned, spawn_after_kill=spawned - killed
        ), LogFindings()
    finally:
        procs.close()


def dbos_takeover(url: str, s: Settings, log_dir: Path) -> tuple[Recovery, LogFindings]:
    """(c) for DBOS: a running executor is told, at the moment of the kill, to recover the dead one's
    workflows (nothing in open-source DBOS notices a dead executor on its own)."""
    marks = MarkLog(Path(tempfile.mkdtemp(dir=log_dir, prefix="dbos-c-")))
    procs = Processes(log_dir)
    try:
        old = dbos_hold(procs, url, s, marks, "bench-dies")
        trigger = marks.directory / "recover-now"
        out = marks.directory / "takeover.json"
        other = dbos_child(
            procs,
            url,
            "takeover",
            out,
            executor="bench-other",
            block=False,
            mark_dir=marks.directory,
            trigger=trigger,
            recover_from="bench-dies",
        )
        wait_for(out.exists, timeout=60, what="the other DBOS executor to launch", procs=[other])
        killed = kill(old)
        trigger.touch()
        first_at, all_at = running_again(
            marks, other, s.in_flight, "the DBOS steps to run on the other executor"
        )
        done = dbos_wait_done(url, marks, other, s.in_flight)
        return Recovery(first_at - killed, all_at - killed, done - killed), LogFindings()
    finally:
        procs.close()


# -- running -----------------------------------------------------------------------------------------


@dataclass
class Results:
    throughput: dict[str, list[Throughput]] = field(default_factory=lambda: defaultdict(list))
    recovery: dict[str, list[Recovery]] = field(default_factory=lambda: defaultdict(list))
    #: (d), (e): by workload, then by system
    scaling: dict[str, dict[str, list[Throughput]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    logs: dict[str, LogFindings] = field(default_factory=lambda: defaultdict(LogFindings))
    failures: dict[str, list[str]] = field(default_factory=dict)


@contextmanager
def database(admin_url: str, prefix: str, ledgerflow: bool) -> Iterator[str]:
    """A fresh database per system and scenario, dropped afterwards (WITH (FORCE), even if a killed
    worker's connections linger). DBOS creates its own schema in it at launch."""
    with fresh_database(admin_url, prefix=prefix) as url:
        if ledgerflow:
            migrate(url)
        yield url


Scenario = tuple[str, str, bool, Callable[[str, Settings, Path], Any]]


def scenarios(s: Settings) -> dict[str, list[Scenario]]:
    """Per workload: (key, label, is ledgerflow, measure) for each system."""
    a: list[Scenario] = [
        ("lf1", f"ledgerflow, 1 worker process x {s.threads} threads", True, lf_one),
        ("lf2", f"ledgerflow, {s.procs} worker processes x {s.threads} threads", True, lf_many),
    ]
    b: list[Scenario] = [("lf", "ledgerflow: new worker process, same name", True, lf_restart)]
    c: list[Scenario] = [("lf", "ledgerflow: other worker, already running", True, lf_takeover)]
    d: list[Scenario] = [
        ("lf1", f"ledgerflow, 1 worker process x {s.threads} threads", True, lf_one_waiting),
        ("lf2", f"ledgerflow, {s.procs} worker processes x {s.threads} threads", True, lf_many_waiting),
    ]
    e: list[Scenario] = [
        ("lf1", f"ledgerflow, 1 worker process x {s.threads} threads", True, lf_one_ready),
        ("lf2", f"ledgerflow, {s.procs} worker processes x {s.threads} threads", True, lf_many_ready),
    ]
    if s.with_dbos:
        a.append(("dbos", "DBOS, 1 process, start_workflow (default executor)", False, dbos_throughput))
        a.append(
            (
                "dbosq",
                f"DBOS, queue: 1 worker process (polled every {s.dbos_poll:g}s), enqueued from another",
                False,
                dbos_queue_throughput,
            )
        )
        b.append(("dbos", "DBOS: relaunch, same executor id", False, dbos_restart))
        c.append(("dbos", "DBOS: other executor, recover called at kill", False, dbos_takeover))
    return {"a": a, "b": b, "c": c, "d": d, "e": e}


#: Connections a scenario may open at its peak: two worker processes (pool, listener, notifier) or two
#: DBOS executors (a pool of 20 each), plus this process's.
CONNECTIONS_NEEDED = 50


def wait_for_connection_room(admin_url: str) -> None:
    """Wait until the server has room for a scenario's connections. Other tenants of a shared server can
    use most of max_connections for a while; a worker refused at start-up would fail the scenario."""

    def room() -> bool:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int"
                " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
            ).fetchone()
        return row is not None and int(row[0]) >= CONNECTIONS_NEEDED

    if not room():
        print(f"  (waiting for {CONNECTIONS_NEEDED} free connections on the server)", flush=True)
        wait_for(room, timeout=300, what=f"{CONNECTIONS_NEEDED} free connections", interval=1.0)


def one_run(admin_url: str, run: int, s: Settings, only: str, results: Results, log_dir: Path) -> str:
    """Every scenario once; returns how long each took, for the progress line."""
    took: list[str] = []
    for w_index, (workload, systems) in enumerate(scenarios(s).items()):
        if workload not in only:
            continue
        # Rotate who goes first, per run and per workload, so that drift (autovacuum, checkpoints, other
        # tenants of the machine) does not always fall on the same system.
        shift = (run + w_index) % len(systems)
        for key, _, is_lf, measure in systems[shift:] + systems[:shift]:
            if s.systems and key not in s.systems:
                continue
            name = f"{workload}.{key}"
            wait_for_connection_room(admin_url)
            began = time.perf_counter()
            try:
                with database(admin_url, f"bench_wf_{workload}_{key}", is_lf) as url:
                    got, findings = measure(url, s, log_dir)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
                results.failures.setdefault(name, []).append(f"run {run + 1}: {message}")
                continue
            finally:
                took.append(f"{name} {time.perf_counter() - began:.0f}s")
            results.logs[name].merge(findings)
            got.run = run
            if workload == "a":
                results.throughput[key].append(got)
            elif workload in "de":
                results.scaling[workload][key].append(got)
            else:
                results.recovery[name].append(got)
    return ", ".join(took)


# -- reporting ---------------------------------------------------------------------------------------


def ms(values: Sequence[float]) -> str:
    return "-" if not values else f"{median(values) * 1000:.2f}"


def secs(values: Sequence[float]) -> str:
    return "-" if not values else f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else "PASS" if ok else "MISS"


def per_run(got: Sequence[Throughput], pick: Callable[[Throughput], list[float]], q: float) -> list[float]:
    """The q-th percentile of each run's values."""
    return [pct(pick(t), q) for t in got if pick(t)]


def same_run_ratios(
    num: Sequence[Throughput], den: Sequence[Throughput], value: Callable[[Throughput], float]
) -> list[float]:
    by_run = {t.run: value(t) for t in den}
    return [value(t) / by_run[t.run] for t in num if by_run.get(t.run)]


def report_throughput(results: Results, s: Settings, labels: dict[str, str]) -> None:
    tp = results.throughput
    lf1, lf2, dbos = tp.get("lf1", []), tp.get("lf2", []), tp.get("dbos", [])

    print(
        f"(a) throughput: {s.workflows} runs of 3 trivial nodes/steps started at once, to the last completion"
    )
    rows = []
    dbosq = tp.get("dbosq", [])
    for key, label in labels.items():
        got = tp.get(key, [])
        vs_dbos = same_run_ratios(got, dbos, lambda t: t.wfps) if key.startswith("lf") else []
        vs_queue = same_run_ratios(got, dbosq, lambda t: t.wfps) if key.startswith("lf") else []
        rows.append(
            [
                label,
                "FAILED" if f"a.{key}" in results.failures and not got else secs([t.wfps for t in got]),
                fmt_ratio(vs_dbos) if vs_dbos else "-",
                fmt_ratio(vs_queue) if vs_queue else "-",
                ">= 3.00 vs queue" if key == "lf1" else "",
                verdict(None if not vs_queue else median(vs_queue) >= 3.0) if key == "lf1" else "",
            ]
        )
    scaling = same_run_ratios(lf2, lf1, lambda t: t.wfps)
    rows.append(
        [
            f"ledgerflow, {s.procs} processes / 1 process",
            "",
            fmt_ratio(scaling) if scaling else "-",
            "",
            ">= 1.80",
            verdict(None if not scaling else median(scaling) >= 1.8),
        ]
    )
    print_table(
        [
            "system",
            "workflows/s median (min-max)",
            "/ DBOS 1 process",
            "/ DBOS queue",
            "target",
            "verdict",
        ],
        rows,
    )
    print(
        "  DBOS 1 process: one process starts the workflows and executes them; DBOS queue: a worker process\n"
        "  serves a DBOS queue that another process enqueues into, the shape of ledgerflow's set-up."
    )

    print(
        "\n(a) where the limit is: CPU per workflow over the timed window (ms), and the share of the "
        f"{CORES} CPUs kept busy"
    )
    rows = []
    for key, label in labels.items():
        got = tp.get(key, [])
        if not got:
            continue
        rows.append(
            [
                label,
                ms([t.worker_cpu / t.count for t in got]),
                "(same process)" if key == "dbos" else ms([(t.starter_cpu or 0.0) / t.count for t in got]),
                ms([t.server_cpu / t.count for t in got]),
                ms([(t.worker_cpu + (t.starter_cpu or 0.0) + t.server_cpu) / t.count for t in got]),
                f"{median([t.busy for t in got]) * 100:.0f}%",
                f"{median([t.others for t in got]) * 100:.0f}%",
                "-"
                if any(t.transactions is None for t in got)
                else f"{median([(t.transactions or 0) / t.count for t in got]):.1f}",
            ]
        )
    print_table(
        [
            "system",
            "executing client",
            "starting client",
            "PostgreSQL",
            "total",
            "CPUs: ours",
            "others'",
            "transactions/wf",
        ],
        rows,
    )
    print(
        "  executing client: the worker processes (DBOS: its one process, which also starts the workflows);\n"
        "  starting client: this benchmark's process starting the runs and watching for their end;\n"
        "  PostgreSQL: the backends serving the benchmark's database (from /proc/<pid>/stat).\n"
        "  CPUs: ours + others' near 100%: the machine is the limit; the split says which side spends it\n"
        "  (others': every other process of this machine over the same window). transactions/wf: the\n"
        "  database's commits and rollbacks over the window, idle polling included, per workflow."
    )
    for key in ("lf1", "lf2"):
        shapes = [shape for t in tp.get(key, []) for shape in t.shapes]
        if shapes:
            counts = {len(t.shapes) for t in tp.get(key, [])}
            print(
                f"  {labels[key]}: {'/'.join(map(str, sorted(counts)))} worker process(es) measured, "
                f"{min(t for t, _ in shapes)}-{max(t for t, _ in shapes)} OS threads each "
                f"({s.threads} node threads, the rest listener, beats and pool), "
                f"{max(c for _, c in shapes)} child processes"
            )
        starting = [t.starting / t.seconds for t in tp.get(key, []) if t.starting is not None]
        if starting:
            print(
                f"  {labels[key]}: the {s.workflows} starts, one after another from this process, took "
                f"{median(starting) * 100:.0f}% of the window ({min(starting) * 100:.0f}-"
                f"{max(starting) * 100:.0f}%; near 100%: the starts, not the workers, set the pace)"
            )

    print(f"\n(a) per-node cost: {s.latency_runs} runs one after another, nothing else queued (ms)")
    rows = []

    def overheads(t: Throughput) -> list[float]:
        return t.overheads

    def handoffs(t: Throughput) -> list[float]:
        return t.handoffs

    def success_begins(t: Throughput) -> list[float]:
        return t.success_begins

    def success_to_next(t: Throughput) -> list[float]:
        return t.success_to_next

    metrics: list[tuple[str, Callable[[Throughput], list[float]], float, float | None]] = [
        ("node overhead p50: body entry to next body entry", overheads, 50, 0.002),
        ("node overhead p99", overheads, 99, None),
        ("hand-off p50: body return to next body entry", handoffs, 50, None),
        ("hand-off p99", handoffs, 99, None),
        ("  hand-off part 1 p50: body return to its success transaction's start", success_begins, 50, None),
        ("  hand-off part 2 p50: that start to the next body's entry", success_to_next, 50, None),
    ]
    dbosq = tp.get("dbosq", [])
    for title, pick, q, target in metrics:
        mine, theirs, queued = per_run(lf1, pick, q), per_run(dbos, pick, q), per_run(dbosq, pick, q)
        theirs_by_run = {t.run: pct(pick(t), q) for t in dbos if pick(t)}
        ratios = [pct(pick(t), q) / theirs_by_run[t.run] for t in lf1 if pick(t) and theirs_by_run.get(t.run)]
        below = None
        if mine and (theirs or queued):
            below = median(mine) < min(median(x) for x in (theirs, queued) if x)
        ok = None if target is None or not mine else median(mine) <= target and below is not False
        rows.append(
            [
                title,
                ms(mine),
                ms(theirs),
                ms(queued),
                fmt_ratio(ratios) if ratios else "-",
                "<= 2.00 and < DBOS" if target else "",
                verdict(ok) if target else "",
            ]
        )
    print_table(
        [
            "metric",
            "ledgerflow (1 process)",
            "DBOS 1 process",
            "DBOS queue",
            "ledgerflow / DBOS 1 process",
            "target",
            "verdict",
        ],
        rows,
    )

    print(f"\n(a) under the {s.workflows}-run load (ms; includes the wait behind other runs' ready nodes)")
    rows = []
    for key, label in labels.items():
        got = tp.get(key, [])
        rows.append(
            [
                label,
                ms(per_run(got, lambda t: t.load_handoffs, 50)),
                ms(per_run(got, lambda t: t.load_handoffs, 99)),
                ms(per_run(got, lambda t: t.load_overheads, 50)),
            ]
        )
    print_table(["system", "hand-off p50", "hand-off p99", "node overhead p50"], rows)


def report_scaling(results: Results, s: Settings, workload: str, labels: dict[str, str]) -> None:
    """(d) and (e): 1 worker process against `--procs`, with what bounds each."""
    got = results.scaling[workload]
    lf1, lf2 = got.get("lf1", []), got.get("lf2", [])
    if workload == "d":
        print(
            f"\n(d) scaling where the machine is not the limit: {s.workflows} runs of 3 nodes that each "
            f"wait {s.wait_ms:g} ms, started at once, to the last completion"
        )
    else:
        print(
            f"\n(e) the workers alone: {s.workflows} runs of 3 trivial nodes made ready at once (started in "
            "one transaction), from its commit to the last completion"
        )
    rows = []
    for key, label in labels.items():
        measured = got.get(key, [])
        failed = f"{workload}.{key}" in results.failures and not measured
        bound = s.threads * (1 if key == "lf1" else s.procs) / (3 * s.wait_ms / 1000)
        rows.append(
            [
                label,
                "FAILED" if failed else secs([t.wfps for t in measured]),
                f"{bound:.0f}" if workload == "d" else "-",
                ms([t.worker_cpu / t.count for t in measured]),
                ms([t.ours / t.count for t in measured]),
                "-" if not measured else f"{median([t.busy for t in measured]) * 100:.0f}%",
                "-" if not measured else f"{median([t.others for t in measured]) * 100:.0f}%",
                "",
                "",
            ]
        )
    scaling = same_run_ratios(lf2, lf1, lambda t: t.wfps)
    rows.append(
        [
            f"ledgerflow, {s.procs} processes / 1 process",
            fmt_ratio(scaling) if scaling else "-",
            "",
            "",
            "",
            "",
            "",
            ">= 1.80" if workload == "d" else "",
            verdict(None if not scaling else median(scaling) >= 1.8) if workload == "d" else "",
        ]
    )
    print_table(
        [
            "system",
            "workflows/s median (min-max)",
            "bound by node threads",
            "workers' CPU/wf ms",
            "all CPU/wf ms",
            "CPUs: ours",
            "others'",
            "target",
            "verdict",
        ],
        rows,
    )
    if workload == "d":
        print("  bound by node threads: workflows/s if the node threads did nothing but wait in the bodies;")
    print(
        "  all CPU/wf: the worker processes, this process and the database's backends, per workflow;\n"
        "  CPUs: ours + others' near 100%: the machine is the limit."
    )


RECOVERY_TITLES = {
    "b": "(b) restart: {n} runs blocked in their first node, worker SIGKILLed, a new process spawned at "
    "once; seconds from the new process's spawn",
    "c": "(c) takeover: {n} runs blocked, worker SIGKILLed, another already running; seconds from the kill "
    "(ledgerflow: lease TTL {ttl:g}s, heartbeat {hb:g}s, recovery sweep every {ri:g}s; DBOS: recovery "
    "requested at the kill)",
}


def report_recovery(results: Results, s: Settings, workload: str, labels: dict[str, str]) -> None:
    ttl, hb, ri = s.effective()
    print("\n" + RECOVERY_TITLES[workload].format(n=s.in_flight, ttl=ttl, hb=hb, ri=ri))
    rows = []
    for key, label in labels.items():
        got = results.recovery.get(f"{workload}.{key}", [])
        failed = f"{workload}.{key}" in results.failures and not got
        first, every = [r.first for r in got], [r.all_running for r in got]
        peers = {r.run: r.all_running for r in results.recovery.get(f"{workload}.dbos", [])}
        ratios = [r.all_running / peers[r.run] for r in got if peers.get(r.run)] if key == "lf" else []
        if key != "lf":
            target, ok = "", None
        elif workload == "b":
            target, ok = "all < 2.00", None if not every else median(every) < 2.0
        else:
            target = "first < 1.00, all < 2.00"
            ok = None if not every else median(first) < 1.0 and median(every) < 2.0
        extra = []
        if got and got[0].spawn_after_kill is not None:
            extra.append(
                f"spawned {median([r.spawn_after_kill or 0.0 for r in got]) * 1000:.0f} ms after the kill"
            )
        if got and got[0].boot is not None:
            extra.append(f"boot to start-up sweep {median([r.boot or 0.0 for r in got]):.2f}s")
        if got and got[0].sweep_ms is not None:
            extra.append(f"start-up sweep {median([r.sweep_ms or 0.0 for r in got]):.0f} ms")
        rows.append(
            [
                label,
                "FAILED" if failed else secs(first),
                "FAILED" if failed else secs(every),
                "FAILED" if failed else secs([r.completed for r in got]),
                fmt_ratio(ratios) if ratios else "",
                target,
                verdict(ok) if target else "",
                ", ".join(extra),
            ]
        )
    print_table(
        [
            "system",
            "first node running",
            "all running",
            "all completed",
            "all running / DBOS",
            "target",
            "verdict",
            "breakdown",
        ],
        rows,
    )


def report_logs(results: Results) -> None:
    print("\nWorkers' logs (warnings and errors, all runs):")
    for name, findings in sorted(results.logs.items()):
        if name.endswith("dbos"):
            continue
        counts = ", ".join(f"{event} x{n}" for event, n in findings.counts.most_common()) or "none"
        clean = name.startswith(("a.", "d.", "e."))
        flag = "  <- a warning in a clean run is a bug" if clean and findings.counts else ""
        print(f"  {name}: {counts}{flag}")
        for line in findings.lease_lost[:5]:
            print(f"      {line[:400]}")
        if len(findings.lease_lost) > 5:
            print(f"      ... and {len(findings.lease_lost) - 5} more workflow_lease_lost lines")


def report(results: Results, s: Settings, only: str) -> None:
    labels = {workload: {k: label for k, label, _, _ in rows} for workload, rows in scenarios(s).items()}
    if "a" in only:
        report_throughput(results, s, labels["a"])
    for workload in "bc":
        if workload in only:
            report_recovery(results, s, workload, labels[workload])
    for workload in "de":
        if workload in only:
            report_scaling(results, s, workload, labels[workload])
    report_logs(results)

    print("\nPer-run values:")
    for key, measured in results.throughput.items():
        print(
            f"  (a) {key:5} workflows/s "
            + " ".join(f"{t.wfps:.0f}" for t in measured)
            + ("   overhead p50 ms " if any(t.overheads for t in measured) else "")
            + " ".join(f"{pct(t.overheads, 50) * 1000:.2f}" for t in measured if t.overheads)
            + ("   hand-off p50 ms " if any(t.handoffs for t in measured) else "")
            + " ".join(f"{pct(t.handoffs, 50) * 1000:.2f}" for t in measured if t.handoffs)
        )
    for workload, systems in results.scaling.items():
        for key, measured in systems.items():
            print(f"  ({workload}) {key:5} workflows/s " + " ".join(f"{t.wfps:.0f}" for t in measured))
    for name, recs in results.recovery.items():
        print(
            f"  ({name[0]}) {name[2:]:5} first s "
            + " ".join(f"{r.first:.2f}" for r in recs)
            + "   all running s "
            + " ".join(f"{r.all_running:.2f}" for r in recs)
            + "   completed s "
            + " ".join(f"{r.completed:.2f}" for r in recs)
        )
    for name, messages in results.failures.items():
        for message in messages:
            print(f"\n{name} failed in {message}")


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def throughput_json(t: Throughput) -> dict[str, Any]:
    """One measurement of (a) as it goes to the JSON file: times in seconds, CPU in ms per workflow."""
    return {
        "run": t.run,
        "workflows_per_s": t.wfps,
        "seconds": t.seconds,
        "starting_s": t.starting,
        "cpu_ms_per_wf": {
            "executing": t.per_workflow_ms(t.worker_cpu),
            "starting": t.per_workflow_ms(t.starter_cpu),
            "postgresql": t.per_workflow_ms(t.server_cpu),
            "total": t.per_workflow_ms(t.ours),
        },
        "cpus_busy": t.busy,
        "others_busy": t.others,
        "transactions_per_wf": None if t.transactions is None else t.transactions / t.count,
        "node_overhead_p50_s": pct(t.overheads, 50) if t.overheads else None,
        "node_overhead_p99_s": pct(t.overheads, 99) if t.overheads else None,
        "handoff_p50_s": pct(t.handoffs, 50) if t.handoffs else None,
        "load_handoff_p50_s": pct(t.load_handoffs, 50) if t.load_handoffs else None,
    }


def save(results: Results, s: Settings, loads: Sequence[str]) -> Path:
    """Every measurement of (a), (d) and (e), the same-run ratios of (a), and the recoveries, with the
    commit and the machine's load, to bench/results/workflows-<UTC time>.json."""
    tp = results.throughput
    ratios = {
        f"{num}/{den}": same_run_ratios(tp.get(num, []), tp.get(den, []), lambda t: t.wfps)
        for num in ("lf1", "lf2")
        for den in ("dbos", "dbosq", "lf1")
        if num != den
    }
    doc = {
        "benchmark": "workflows",
        "commit": commit(),
        "settings": {k: v for k, v in vars(s).items() if k != "url"},
        "cpus": CORES,
        "load_average": list(loads),
        "throughput": {k: [throughput_json(t) for t in got] for k, got in tp.items()},
        "throughput_ratios": {k: {"median": median(v), "runs": v} for k, v in ratios.items() if v},
        "scaling": {
            w: {k: [throughput_json(t) for t in got] for k, got in systems.items()}
            for w, systems in results.scaling.items()
        },
        "recovery": {
            name: [
                {"first_s": r.first, "all_running_s": r.all_running, "completed_s": r.completed} for r in recs
            ]
            for name, recs in results.recovery.items()
        },
        "failures": results.failures,
    }
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"workflows-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def configure_logs() -> None:
    """Warnings and errors only, and on stderr, so they never interleave with the tables on stdout."""
    import logging

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs, each on fresh databases (default 3)")
    parser.add_argument(
        "--url",
        default=default_admin_url(),
        help="server to use; databases are created and dropped per run (default: "
        "$LEDGERFLOW_BENCH_URL or the local server)",
    )
    parser.add_argument("--only", default="abcde", help="workloads to run, e.g. 'a' or 'bd' (default abcde)")
    parser.add_argument("--workflows", type=int, default=500, help="(a) runs started at once")
    parser.add_argument("--latency-runs", type=int, default=30, help="(a) runs one after another")
    parser.add_argument(
        "--procs", type=int, default=2, help="(a), (d), (e) worker processes of the scaled-out measurement"
    )
    parser.add_argument(
        "--threads", type=int, default=8, help="(a), (d), (e) node threads of every worker process"
    )
    parser.add_argument("--wait-ms", type=float, default=50.0, help="(d) how long each body waits, ms")
    parser.add_argument("--in-flight", type=int, default=1000, help="(b), (c) runs in flight at the kill")
    parser.add_argument(
        "--lease-ttl", type=float, default=None, help="(b), (c) lease TTL, s (default: the product's)"
    )
    parser.add_argument("--heartbeat", type=float, default=None, help="(b), (c) heartbeat interval, s")
    parser.add_argument(
        "--recovery-interval", type=float, default=None, help="(b), (c) recovery sweep interval, s"
    )
    parser.add_argument("--no-dbos", action="store_true", help="skip DBOS")
    parser.add_argument(
        "--systems",
        default="",
        help="only these systems, by key, comma-separated (lf1, lf2, dbos, dbosq; lf in (b), (c))",
    )
    parser.add_argument(
        "--dbos-poll", type=float, default=0.05, help="(a) the DBOS queue's polling interval, s (DBOS: 1)"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs and marks; print where")
    args = parser.parse_args(argv)
    configure_logs()
    # Ctrl-C and SIGTERM unwind through the context managers, so databases and processes are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    problem = "skipped (--no-dbos)" if args.no_dbos else wf_dbos.status()
    s = Settings(
        url=args.url,
        workflows=args.workflows,
        latency_runs=args.latency_runs,
        procs=args.procs,
        threads=args.threads,
        wait_ms=args.wait_ms,
        in_flight=args.in_flight,
        lease_ttl=args.lease_ttl,
        heartbeat=args.heartbeat,
        recovery_interval=args.recovery_interval,
        with_dbos=problem is None,
        dbos_poll=args.dbos_poll,
        systems=tuple(k for k in args.systems.split(",") if k),
    )
    with psycopg.connect(args.url) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
            "current_setting('fsync')"
        ).fetchone()
    assert row is not None
    print(
        f"PostgreSQL {row[0]} (synchronous_commit={row[1]}, fsync={row[2]}), {CORES} CPUs, "
        f"Python {sys.version.split()[0]}, psycopg {psycopg.__version__}, "
        f"DBOS {importlib.metadata.version('dbos') if problem is None else problem}"
    )
    print(f"load average {load_average()}")
    print(f"{args.runs} runs, each system and scenario on a fresh database; medians over runs\n", flush=True)

    results = Results()
    loads = [load_average()]
    started = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-workflows-"))
    try:
        for run in range(args.runs):
            t0 = time.perf_counter()
            took = one_run(args.url, run, s, args.only, results, log_dir)
            loads.append(load_average())
            print(
                f"run {run + 1}/{args.runs} done in {time.perf_counter() - t0:.0f}s ({took}); "
                f"load average {loads[-1]}",
                flush=True,
            )
    finally:
        if args.keep_logs:
            print(f"logs and marks kept in {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    print(f"\nTotal {time.perf_counter() - started:.0f}s\n")
    report(results, s, args.only)
    print(f"\nresults written to {save(results, s, loads)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

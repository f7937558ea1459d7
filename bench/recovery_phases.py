"""Where the time of a recovery goes: every worker SIGKILLed with nodes in flight, as many started again
under the same names, and each restarted process's way from its spawn to running every node again, in
phases, with its CPU time.

Run by hand (it is not a test):

    python -m bench.recovery_phases [--runs 500] [--workers 2] [--concurrency 250] [--rounds 3]
        [--url postgresql://postgres@127.0.0.1:5432/postgres]

One fresh database; `--runs` runs of bench.runs_at_scale's holding workflow (one node that holds until
killed), held by `--workers` `ledgerflow worker` processes of `--concurrency` node threads. Each round
kills every worker, spawns as many again and times, from the spawn (wall clock, and the processes' CPU
time read from /proc):

  started      the worker logged `workflow_worker_started` (interpreter, imports, settings, the store);
  recovered    its start-up recovery ended (`workflow_recovery`: the sweep that takes nodes back);
  all running  every held node is claimed again by a restarted process (the runs_at_scale measure).

CPU time per process is what the machine's load does not distort: the wall time of each phase on a
shared machine is its CPU time divided by the share of the CPUs the process got. Also measured once: the
CPU time of the imports alone (`python -c 'import ops.cli.commands'`). ledgerflow's bytecode is written
first, as a wheel's install writes it (`--no-compile`: not). JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._common import default_admin_url, fresh_database, quiet_logs
from bench.runs_at_scale import HOLD, ROOT, registry, scalar
from eventstore import open_store
from projector import ProjectorWorker
from workflows import Engine, workflow_tables

_RUNNING_SINCE = """
SELECT count(*) FROM ledgerflow.workflow_queue
 WHERE workflow = %(workflow)s AND status = 'claimed' AND claimed_at >= %(since)s
"""
_TICKS = os.sysconf("SC_CLK_TCK")


def spawn(url: str, name: str, concurrency: int, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "bench.runs_at_scale:registry",
        "LEDGERFLOW_WORKER_CONCURRENCY": str(concurrency),
        "LEDGERFLOW_LOG_LEVEL": "info",
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "worker", "--name", name],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a live process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def log_times(log: Path, spawned: float) -> dict[str, float]:
    """Seconds from the spawn (a Unix time) to the phases the worker's JSON log marks."""
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event, at = entry.get("event"), entry.get("timestamp")
        if at is None:
            continue
        seconds = datetime.fromisoformat(at).timestamp() - spawned
        if event == "workflow_worker_started" and "started" not in out:
            out["started"] = seconds
        if event == "workflow_recovery" and entry.get("trigger") == "startup" and "recovered" not in out:
            out["recovered"] = seconds
            out["recovery_ms"] = float(entry.get("duration_ms", 0))
            out["taken_back"] = float(entry.get("reclaimed", 0))
    return out


def import_cpu() -> float:
    """CPU seconds of the worker's imports alone, in a fresh interpreter."""
    began = os.times()
    subprocess.run(
        [sys.executable, "-c", "import ops.cli.commands, bench.runs_at_scale"], cwd=ROOT, check=True
    )
    ended = os.times()
    return (ended.children_user - began.children_user) + (ended.children_system - began.children_system)


def compile_sources() -> None:
    """Write the bytecode of ledgerflow's packages, as a wheel's install does: an editable checkout run
    under PYTHONDONTWRITEBYTECODE (this machine sets it) would otherwise compile every module at every
    worker start, about a quarter of a restart's CPU."""
    for package in ("eventstore", "projector", "workflows", "ops", "bench"):
        compileall.compile_dir(ROOT / package, quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=default_admin_url())
    parser.add_argument(
        "--no-compile", action="store_true", help="leave ledgerflow's bytecode as it is (see compile_sources)"
    )
    args = parser.parse_args()
    quiet_logs()
    if not args.no_compile:
        compile_sources()
    held = min(args.runs, args.workers * args.concurrency)
    loads = [os.getloadavg()[0]]
    imports = [import_cpu() for _ in range(3)]
    rounds: list[dict[str, Any]] = []
    logs = Path(tempfile.mkdtemp(prefix="recovery_phases-"))
    with fresh_database(args.url, "bench_recovery") as url, open_store(url=url) as store:
        engine = Engine(store, registry)
        for _ in range(args.runs):
            engine.start(HOLD, input=None)
        worker = ProjectorWorker(store, [workflow_tables])
        try:
            worker.run_until_caught_up()
        finally:
            worker.release_all()
        names = [f"phases-{i}" for i in range(args.workers)]
        since = scalar(store, "SELECT clock_timestamp()", {})
        procs = [spawn(url, n, args.concurrency, logs / f"{n}-0.log") for n in names]
        try:
            while scalar(store, _RUNNING_SINCE, {"workflow": HOLD, "since": since}) < held:
                time.sleep(0.05)
            for index in range(1, args.rounds + 1):
                for p in procs:
                    p.send_signal(signal.SIGKILL)
                for p in procs:
                    p.wait()
                since = scalar(store, "SELECT clock_timestamp()", {})
                spawned, began = time.time(), time.perf_counter()
                procs = [spawn(url, n, args.concurrency, logs / f"{n}-{index}.log") for n in names]
                while scalar(store, _RUNNING_SINCE, {"workflow": HOLD, "since": since}) < held:
                    time.sleep(0.01)
                seconds = time.perf_counter() - began
                cpu = [cpu_seconds(p.pid) for p in procs]
                phases = [log_times(logs / f"{n}-{index}.log", spawned) for n in names]
                rounds.append({"all_running": seconds, "cpu": cpu, "phases": phases})
                print(
                    f"round {index}: all {held} running after {seconds:.2f} s; per process: "
                    + "; ".join(
                        f"started {ph.get('started', float('nan')):.2f} s, recovered "
                        f"{ph.get('recovered', float('nan')):.2f} s ({ph.get('recovery_ms', 0):.0f} ms, "
                        f"{ph.get('taken_back', 0):.0f} nodes), CPU {c:.2f} s"
                        for ph, c in zip(phases, cpu, strict=True)
                    ),
                    flush=True,
                )
        finally:
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait()
    loads.append(os.getloadavg()[0])
    med_all = statistics.median(r["all_running"] for r in rounds)
    med_cpu = statistics.median(max(r["cpu"]) for r in rounds)
    print(f"imports alone: CPU {statistics.median(imports):.2f} s (median of 3)")
    print(f"all running: median {med_all:.2f} s; the busiest restarted process's CPU by then {med_cpu:.2f} s")
    print(f"load average before {loads[0]:.1f}, after {loads[1]:.1f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (results / f"recovery_phases-{stamp}.json").write_text(
        json.dumps({"args": vars(args), "imports_cpu": imports, "rounds": rounds, "load": loads}, indent=2)
    )


if __name__ == "__main__":
    main()

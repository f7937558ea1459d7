"""What a `ledgerflow` call costs before it does its work: the CPU (user + system) of whole CLI processes,
and of importing the packages, as a user and the test suite pay it on every call.

Run by hand (it is not a test):

    python bench/cli_startup.py [--runs 10] [--source DIR] [--base OTHER] [--label after]

Each command runs RUNS times, one after the other, as `python -m ops.cli ...` (what `ledgerflow` runs)
from the source tree DIR (default: this checkout); with `--base OTHER` (e.g. `git archive` of the commit
before a change) each run of it alternates with one of the base tree, with the same interpreter and
libraries. The figure is the median CPU
of the child process, from `getrusage(RUSAGE_CHILDREN)`: CPU time, unlike wall-clock time, barely moves
with the load of a shared machine. Commands that need a database get a fresh one, migrated first. The
long-running roles (`worker`, `projector`, `serve`) are measured until they log that they are ready, their
CPU read from the process (psutil), and then stopped.
The results are printed and written to bench/results/cli_startup-<time>-<label>.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench._common import default_admin_url, fresh_database, load_average, median

ROOT = Path(__file__).resolve().parents[1]

#: (label, argv after the interpreter, needs a database).
COMMANDS: list[tuple[str, list[str], bool]] = [
    ("ledgerflow --help", ["-m", "ops.cli", "--help"], False),
    ("ledgerflow append --help", ["-m", "ops.cli", "append", "--help"], False),
    ("ledgerflow workflows list --help", ["-m", "ops.cli", "workflows", "list", "--help"], False),
    ("ledgerflow append", ["-m", "ops.cli", "append", "bench-1", "--type", "Noted", "--data", "{}"], True),
    ("ledgerflow read", ["-m", "ops.cli", "read", "bench-1"], True),
    ("ledgerflow projections status", ["-m", "ops.cli", "projections", "status"], True),
    ("ledgerflow workflows list", ["-m", "ops.cli", "workflows", "list"], True),
    ('python -c "import eventstore"', ["-c", "import eventstore"], False),
    ('python -c "import workflows"', ["-c", "import workflows"], False),
    ('python -c "import ops.serve"', ["-c", "import ops.serve"], False),
]

#: Long-running roles: (label, arguments of `ledgerflow`, the log events that say it is ready).
ROLES: list[tuple[str, list[str], set[str]]] = [
    ("ledgerflow worker", ["worker", "--name", "bench"], {"workflow_worker_started"}),
    ("ledgerflow projector", ["projector"], {"projector_worker_started"}),
    (
        "ledgerflow serve",
        ["serve", "--port", "0"],
        {"api_listening", "workflow_worker_started", "projector_worker_started"},
    ),
]


def _command_cpu(argv: list[str], cwd: Path, *, env: dict[str, str]) -> float:
    return child_cpu(argv, cwd, env)


def _role_cpu(args: list[str], ready: set[str], cwd: Path, *, env: dict[str, str]) -> float:
    return role_cpu(args, ready, cwd, env)


def child_cpu(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """User + system seconds of one child process run to its end (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def role_cpu(args: list[str], ready: set[str], cwd: Path, env: dict[str, str]) -> float:
    """User + system seconds a long-running role spent until it logged every event of `ready` (its
    threads included), read from the process itself; then it is stopped with SIGTERM."""
    role = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    is_ready = threading.Event()

    def read_logs() -> None:
        # Read to the end, not only until ready: a full pipe would stall the role's logging.
        assert role.stderr is not None
        waiting = set(ready)
        for line in role.stderr:
            if waiting and line.startswith("{"):
                waiting.discard(json.loads(line).get("event"))
                if not waiting:
                    is_ready.set()

    reader = threading.Thread(target=read_logs, daemon=True)
    reader.start()
    try:
        if not is_ready.wait(timeout=120):
            raise RuntimeError(f"{args} was not ready within 120 s")
        times = psutil.Process(role.pid).cpu_times()
        return float(times.user + times.system)
    finally:
        role.send_signal(signal.SIGTERM)
        try:
            role.wait(timeout=60)
        except subprocess.TimeoutExpired:
            role.kill()
            role.wait()
        reader.join(timeout=10)


def commit_of(source: Path) -> str:
    found = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def summary(cpu: list[float]) -> dict[str, float]:
    return {
        "median_cpu_ms": round(median(cpu) * 1000, 1),
        "min_cpu_ms": round(min(cpu) * 1000, 1),
        "max_cpu_ms": round(max(cpu) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--source", type=Path, default=ROOT, help="The source tree whose code runs.")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="Another source tree (the code before a change), run alternately with --source: a change in "
        "the machine's load then weighs on both alike.",
    )
    parser.add_argument("--label", default="run", help="Names the results file (e.g. before, after).")
    parser.add_argument(
        "--only", default=None, help="Only the commands whose label contains one of these (comma-separated)."
    )
    args = parser.parse_args()
    trees = {"source": args.source.resolve()}
    if args.base is not None:
        trees = {"base": args.base.resolve(), **trees}
    load_before = load_average()
    cpu: dict[str, dict[str, list[float]]] = {}
    with fresh_database(default_admin_url(), prefix="bench_cli") as url:
        # Without -P the source tree's directory comes first on sys.path: its packages are the ones run.
        env = os.environ | {"LEDGERFLOW_DATABASE_URL": url, "LEDGERFLOW_LOG_LEVEL": "warning"}
        subprocess.run([sys.executable, "-m", "ops.cli", "migrate"], cwd=trees["source"], env=env, check=True)
        roles_env = env | {
            "LEDGERFLOW_LOG_LEVEL": "info",
            "LEDGERFLOW_LOG_FORMAT": "json",
            "LEDGERFLOW_WORKFLOWS": "workflows.demo:registry",
            "LEDGERFLOW_POOL_MAX_SIZE": "4",
        }
        measures: list[tuple[str, Callable[[Path], float]]] = [
            (label, functools.partial(_command_cpu, [sys.executable, *argv], env=env))
            for label, argv, _needs_database in COMMANDS
        ]
        measures += [
            (f"{label} (until ready)", functools.partial(_role_cpu, role_args, ready, env=roles_env))
            for label, role_args, ready in ROLES
        ]
        for label, measure in measures:
            if args.only is not None and not any(part in label for part in args.only.split(",")):
                continue
            cpu[label] = {name: [] for name in trees}
            for _ in range(args.runs):
                for name, tree in trees.items():
                    cpu[label][name].append(measure(tree))
            shown = "  ".join(
                f"{name} {median(values) * 1000:7.1f} ms" for name, values in cpu[label].items()
            )
            print(f"{label:42} {shown}  (median CPU of {args.runs})")
    results: dict[str, Any] = {
        label: {name: summary(values) for name, values in per_tree.items()} for label, per_tree in cpu.items()
    }
    record = {
        "benchmark": "CLI and import start-up CPU (user + system of the child process)",
        "command": " ".join(["python", "bench/cli_startup.py", *sys.argv[1:]]),
        "trees": {name: {"path": str(tree), "commit": commit_of(tree)} for name, tree in trees.items()},
        "python": sys.version.split()[0],
        "machine": f"{os.cpu_count()} CPUs; load before {load_before}, after {load_average()}",
        "runs": args.runs,
        "results": results,
    }
    out = ROOT / "bench" / "results" / f"cli_startup-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    out = out.with_name(f"{out.name}-{args.label}.json")
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""The instrument of the workflow benchmark: node (step) bodies note when they were entered and when they
returned, and the benchmark reads those notes back.

Both systems are timed by the same instrument: a body appends `<run> <node> <in|out> <time>` to a file of
its own process (`BENCH_MARK_DIR/<pid>.marks`), one O_APPEND write per line, so lines of concurrent
threads never interleave and a SIGKILL loses nothing already written. The benchmark reads the files
incrementally (only the bytes added since its last look), so watching them costs next to nothing while
the measured work runs.

From the notes come:
  - node overhead: one body's entry to the next body's entry (everything the engine does per node);
  - hand-off: one body's return to the next body's entry (recording the success, making the successor
    ready, claiming it, loading the run, starting the body). ledgerflow's own events cannot give this:
    its NodeSucceeded and the successor's NodeClaimed are written by one transaction, so their
    `recorded_at` (the transaction's start) are equal by construction.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ENTER = "in"
RETURN = "out"

_fd: int | None = None
_fd_lock = threading.Lock()


def mark(run_id: str, node: str, phase: str) -> None:
    """Note that a body of `node` in run `run_id` was entered (ENTER) or is returning (RETURN).

    Does nothing outside a benchmark (no BENCH_MARK_DIR), so importing the flows is harmless."""
    global _fd
    now = time.time()
    directory = os.environ.get("BENCH_MARK_DIR")
    if not directory:
        return
    if _fd is None:
        with _fd_lock:
            if _fd is None:
                path = os.path.join(directory, f"{os.getpid()}.marks")
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{run_id} {node} {phase} {now:.6f}\n".encode())


#: Never set: a blocked body waits on it until its process is killed (or this many seconds).
_NEVER = threading.Event()
BLOCK_SECONDS = 3600.0


def block_if_asked() -> None:
    """BENCH_BLOCK=1: the body hangs (as a long LLM call would) until its process is killed. The process
    that takes over runs without it, so the nodes then finish at once."""
    if os.environ.get("BENCH_BLOCK") == "1":
        _NEVER.wait(BLOCK_SECONDS)


@dataclass
class _File:
    offset: int = 0
    partial: bytes = b""


@dataclass
class MarkLog:
    """Every process's notes in one directory, read incrementally: (pid, run, node, phase) -> first time."""

    directory: Path
    times: dict[tuple[int, str, str, str], float] = field(default_factory=dict)
    _files: dict[Path, _File] = field(default_factory=dict)

    def update(self) -> MarkLog:
        for path in self.directory.glob("*.marks"):
            state = self._files.setdefault(path, _File())
            with path.open("rb") as f:
                f.seek(state.offset)
                chunk = f.read()
            if not chunk:
                continue
            state.offset += len(chunk)
            data = state.partial + chunk
            # A line being written right now is kept for the next look.
            complete, _, state.partial = data.rpartition(b"\n")
            pid = int(path.stem)
            for line in complete.decode().splitlines():
                parts = line.split()
                if len(parts) == 4:
                    self.times.setdefault((pid, parts[0], parts[1], parts[2]), float(parts[3]))
        return self

    def entered(self, node: str, pid: int | None = None, phase: str = ENTER) -> dict[str, float]:
        """Run -> when `node`'s body was first entered (or returned, with phase=RETURN), in process `pid`
        or in any."""
        found: dict[str, float] = {}
        for (p, run, n, ph), at in self.times.items():
            if n == node and ph == phase and (pid is None or p == pid):
                found[run] = min(at, found.get(run, at))
        return found

    def count(self, node: str, pid: int | None = None, phase: str = ENTER) -> int:
        return len(self.entered(node, pid, phase))

    def by_run(self) -> dict[tuple[str, str, str], float]:
        """(run, node, phase) -> earliest time in any process."""
        out: dict[tuple[str, str, str], float] = {}
        for (_, run, node, phase), at in self.times.items():
            key = (run, node, phase)
            out[key] = min(at, out.get(key, at))
        return out


def node_gaps(log: MarkLog, runs: Iterable[str], nodes: Sequence[str]) -> tuple[list[float], list[float]]:
    """(overheads, hand-offs) in seconds over consecutive nodes of `runs`: entry to next entry, and return
    to next entry."""
    times = log.by_run()
    overheads: list[float] = []
    handoffs: list[float] = []
    for run in runs:
        for prev, nxt in itertools.pairwise(nodes):
            entered, returned = times.get((run, prev, ENTER)), times.get((run, prev, RETURN))
            next_entered = times.get((run, nxt, ENTER))
            if next_entered is None:
                continue
            if entered is not None:
                overheads.append(next_entered - entered)
            if returned is not None:
                handoffs.append(next_entered - returned)
    return overheads, handoffs


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile by nearest rank (no interpolation: every value reported was observed)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]

"""A worker frozen inside one of its transactions loses its nodes to a peer within its lease and a sweep,
every time.

Two real `ledgerflow worker` processes, lease 1.5 s, the default sweep interval. Each round starts three
runs whose first node writes checkpoints, progress and steps one after another (a fenced transaction each,
so the holder's sessions are nearly always inside one) until the test opens its gate. The test watches
the sessions of the first run's holder in pg_stat_activity and freezes the process (SIGSTOP) the moment
one of them is seen inside a transaction ("idle in transaction", or "active" in one: mid-pipeline, at
COMMIT, in a claim or a sweep), then times how long the peer takes to run every node the frozen process
held. Then the frozen process is resumed: fencing must refuse whatever it goes on writing (no event of an
old attempt after a newer claim, each node completed once, one completion per run), and it must go on
working. Every takeover time is printed. The number of rounds is FROZEN_DRILL_ROUNDS (default 12).

A session the server blocks writing to a frozen client ("active", ClientWrite, row locks held, where no
idle timeout applies) is proved ended in tests/integration/test_frozen_sessions.py: a node's end no
longer answers with another run's signal payloads (migration 0031), so a drill cannot make it that big.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # psutil ships no type stubs; types-psutil is not a dependency
import psycopg
import pytest

from eventstore import EventStore
from tests.acceptance.drill_workers import start_worker
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry
from workflows import events as ev

# Serial: it times every takeover, after the rest, in its lane.
pytestmark = [pytest.mark.drill, pytest.mark.serial]

#: The workers' lease. What is proved is relative to it (a takeover within the lease and a sweep), so it is
#: short: each round waits it out once. A heartbeat every lease / 4 (0.375 s) is still hundreds of times a
#: heartbeat's round trip on the machine the drill has to itself.
LEASE = 1.5
#: Rounds (pauses), each aimed inside a transaction of the node's holder.
ROUNDS = int(os.environ.get("FROZEN_DRILL_ROUNDS", "12"))
#: The sweep interval of the workers (the default).
SWEEP = 2.0
#: Runs started each round; the holder of the first is frozen, and every node it holds is timed.
RUNS_PER_ROUND = 3
#: The bound of each takeover: the lease, one sweep (a session stuck mid-pipeline is ended at the peer's
#: periodic sweep), and room for a shared, loaded 2-core machine (the peer's sweep, its claim and its
#: node's first statements take their turn).
BOUND = LEASE + 2.0 + 4.0

registry = WorkflowRegistry()
busy = Workflow("busy")


def mark(ctx: NodeContext) -> Path:
    """Note when this process entered the run's node; returns the directory of the marks."""
    marks = Path(os.environ["FROZEN_MARKS"])
    fd = os.open(marks / f"{os.getpid()}.marks", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{ctx.run_id} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)
    return marks


def _work(ctx: NodeContext) -> int:
    marks = mark(ctx)
    gate = marks / f"{ctx.run_id}.gate"
    i = 0
    # The node's work until the gate opens: fenced transactions of each kind a body makes, one after another.
    while not gate.exists():
        ctx.checkpoint(f"{ctx.attempt}-{i}", i)
        ctx.progress(i)
        if i % 5 == 0:
            ctx.step(f"{ctx.attempt}-step-{i}", os.getpid)
        i += 1
    return os.getpid()


@busy.node(max_crashes=100)
def work(ctx: NodeContext) -> int:
    return _work(ctx)


@busy.node(depends_on=["work"])
def after(ctx: NodeContext) -> int:
    return int(ctx.outputs["work"])


registry.register(busy)

#: Claims, and the events an attempt writes under its claim's fence, each with the attempt's number.
BY_ATTEMPT = {ev.NODE_CLAIMED, ev.NODE_CHECKPOINT, ev.STEP_RECORDED, ev.NODE_SUCCEEDED}


def entered(marks: Path, pid: int) -> dict[str, float]:
    path = marks / f"{pid}.marks"
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            run_id, at = line.split()
            found.setdefault(run_id, float(at))
    return found


def ports_of(pid: int) -> list[int]:
    """The local ports of the process's TCP connections to the database."""
    return [c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr]


def freeze_inside_a_transaction(watch: psycopg.Connection[Any], worker: subprocess.Popen[bytes]) -> str:
    """SIGSTOP `worker` right after one of its node sessions is seen inside a transaction; what was seen."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = watch.execute(
            "SELECT state, coalesce(wait_event, ''), application_name || ': ' || left(query, 60)"
            "  FROM pg_stat_activity WHERE client_port = ANY(%s) AND xact_start IS NOT NULL"
            "   AND state IN ('idle in transaction', 'active') LIMIT 1",
            (ports_of(worker.pid),),
        ).fetchone()
        if row is not None:
            worker.send_signal(signal.SIGSTOP)
            return f"{row[0]} ({row[1]}): {row[2]}"
    raise AssertionError("never saw the holder inside a transaction")


def all_completed(store: EventStore, run_ids: list[uuid.UUID]) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.events WHERE event_type = %s", (ev.RUN_COMPLETED,)
        ).fetchone()
    return row is not None and row[0] >= len(run_ids)


def held_by(store: EventStore, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, str] | None:
    """Which worker holds each run's first node, once every one is held."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT run_id, worker_name FROM ledgerflow.workflow_queue"
            " WHERE run_id = ANY(%s) AND node = 'work' AND status = 'claimed'",
            (run_ids,),
        ).fetchall()
    return {r: str(w) for r, w in rows} if len(rows) == len(run_ids) else None


def freeze_one_holder(
    store: EventStore,
    watch: psycopg.Connection[Any],
    procs: dict[str, subprocess.Popen[bytes]],
    marks: Path,
    batch: list[uuid.UUID],
) -> tuple[str, float]:
    """Freeze the holder of the batch's first run inside one of its transactions; returns what it was
    doing and how long after the freeze the last of its nodes ran on the peer (inf: not within 30 s).
    The frozen worker is resumed and the batch's gates opened."""
    holders = wait_until(lambda: held_by(store, batch), timeout=60, what="the runs to be claimed")
    assert holders is not None
    name = holders[batch[0]]
    frozen, peer = procs[name], procs["two" if name == "one" else "one"]
    mine = {str(r) for r in batch if holders[r] == name}

    def running_on(p: subprocess.Popen[bytes]) -> bool:
        return mine <= set(entered(marks, p.pid))

    wait_until(lambda: running_on(frozen), timeout=30, what="the frozen worker's nodes to run")
    what = freeze_inside_a_transaction(watch, frozen)
    stopped = time.time()
    try:
        wait_until(lambda: running_on(peer), timeout=30, what="the peer to take the nodes over")
        took = max(entered(marks, peer.pid)[r] for r in mine) - stopped
    except AssertionError:
        took = float("inf")
    frozen.send_signal(signal.SIGCONT)
    for r in batch:
        (marks / f"{r}.gate").touch()
    return what, took


def test_a_worker_frozen_inside_a_transaction_is_taken_over_every_time(
    store: EventStore, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        "FROZEN_MARKS": str(marks),
        "LEDGERFLOW_LOG_LEVEL": "info",
        # The default sweep interval: the frozen sessions a peer ends, it ends at its periodic sweep.
        "LEDGERFLOW_RECOVERY_INTERVAL": str(SWEEP),
    }
    log = tmp_path / "workers.log"
    workflows = "tests.acceptance.test_frozen_takeover_drill:registry"
    procs = {
        name: start_worker(store.url, name, log, lease_ttl=LEASE, workflows=workflows, concurrency=4, env=env)
        for name in ("one", "two")
    }
    engine = Engine(store, registry)
    times: list[float] = []
    seen: list[str] = []
    run_ids: list[uuid.UUID] = []
    try:
        with psycopg.connect(store.url, autocommit=True) as watch:
            for _ in range(ROUNDS):
                batch = [engine.start("busy").run_id for _ in range(RUNS_PER_ROUND)]
                run_ids += batch
                what, took = freeze_one_holder(store, watch, procs, marks, batch)
                seen.append(what)
                times.append(took)
            wait_until(lambda: all_completed(store, run_ids), timeout=120, what="the runs to complete")
            alive = {name: p.poll() is None for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=60)
    print(f"\n{ROUNDS} freezes inside a transaction (lease {LEASE:g} s, sweep {SWEEP:g} s); takeover (s):")
    for s, t in zip(seen, times, strict=True):
        print(f"  {t:6.2f}  frozen while {s}")
    print(f"  most {max(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s")
    assert alive == {"one": True, "two": True}, "a frozen and resumed worker goes on working"
    for run_id in run_ids:
        events = list(store.read_stream(ev.run_stream(run_id), limit=100_000))
        # Fencing: once the node is claimed again, the frozen attempt writes nothing more.
        attempts = [
            e.data["attempt"] for e in events if e.type in BY_ATTEMPT and e.data.get("node") == "work"
        ]
        assert attempts == sorted(attempts), f"run {run_id}: an old attempt wrote after the takeover"
        completed = [e.data.get("node") for e in events if e.type == ev.NODE_SUCCEEDED]
        assert completed == ["work", "after"], f"run {run_id}: nodes completed {completed}"
        assert [e.type for e in events].count(ev.RUN_COMPLETED) == 1
    assert max(times) < BOUND, f"takeovers (s): {times}"

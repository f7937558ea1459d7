"""Workers on other hosts, cut off from the database mid-node and healed.

Each `ledgerflow worker` runs in a network namespace of its own (tests/netns.py) and reaches the database
through a forwarder on its link. The drill cuts one worker's link while it runs a node: packets vanish,
no reset, no FIN, as in a real partition. Its session stays open on the server (the forwarder holds it,
as a server holds a vanished client's until its own keepalives give up), so its presence stays too, and
the node is taken over only when its lease lapses. The cut-off worker notices within its connections' TCP
timeouts (eventstore.db.NETWORK_TIMEOUTS) and reports the outage; the partition lasts until it has. Then
the link heals: whatever the cut-off worker still sends for that node is refused by the fence, and it
carries on as a healthy worker, claiming and finishing new work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore, RecordedEvent
from tests import netns
from tests.acceptance.drill_workers import DRILL_SHUTDOWN_GRACE
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry
from workflows import events as ev

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.partition,
    pytest.mark.drill,
    pytest.mark.serial,  # it times a lease's lapse and a reconnection, after the rest, in its lane
    pytest.mark.own_servers,
    pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable())),
]
#: Short leases, so that the drill ends within about a minute.
LEASE = 3.0

registry = WorkflowRegistry()
long_node = Workflow("partitioned")
quick = Workflow("after_partition")
_PACE = threading.Event()


@long_node.node()
def work(ctx: NodeContext) -> dict[str, Any]:
    """Items one after another, each checkpointed with the worker that did it, until the gate opens;
    a resumed attempt skips the items already checkpointed."""
    gate = Path(os.environ["PARTITION_GATE"])
    i = 0
    while True:
        item = f"item-{i}"
        done, _ = ctx.checkpointed(item)
        if not done:
            if gate.exists():
                return {"items": i, "finished_by": ctx.worker}
            ctx.checkpoint(item, {"worker": ctx.worker, "attempt": ctx.attempt})
            ctx.progress(i, None, f"{ctx.worker} at {item}")
            _PACE.wait(0.05)
        i += 1


@quick.node()
def done(ctx: NodeContext) -> str:
    return ctx.worker


registry.register(long_node)
registry.register(quick)


class Worker:
    """A `ledgerflow worker` in a host of its own; its JSON log lines in a file."""

    def __init__(self, name: str, host: netns.Host, url: str, tmp_path: Path, gate: Path) -> None:
        self.name = name
        self.log = tmp_path / f"{name}.log"
        env = os.environ | {
            "LEDGERFLOW_DATABASE_URL": url,
            "LEDGERFLOW_WORKFLOWS": "tests.acceptance.test_partition:registry",
            "LEDGERFLOW_WORKFLOW_LEASE_TTL": str(LEASE),
            "LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL": str(LEASE / 4),
            "LEDGERFLOW_RECOVERY_INTERVAL": "0.5",
            "LEDGERFLOW_LOG_FORMAT": "json",
            "LEDGERFLOW_WORKER_SHUTDOWN_GRACE": DRILL_SHUTDOWN_GRACE,
            "LEDGERFLOW_LOG_LEVEL": "info",
            "PARTITION_GATE": str(gate),
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                host.command([sys.executable, "-m", "ops.cli", "worker", "--name", name]),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def events(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == event]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def hosts() -> Iterator[tuple[netns.Host, netns.Host]]:
    with netns.isolated_host("cut") as cut, netns.isolated_host("peer") as peer:
        yield cut, peer


def run_events(store: EventStore, run_id: uuid.UUID) -> list[RecordedEvent]:
    return list(store.read_stream(ev.run_stream(run_id), limit=100_000))


def of_type(events: list[RecordedEvent], event_type: str) -> list[RecordedEvent]:
    return [e for e in events if e.type == event_type]


def writes_of(events: list[RecordedEvent], worker: str) -> list[RecordedEvent]:
    """The node's checkpoints and progress written by `worker` (the node names it in both)."""
    return [
        e
        for e in events
        if (e.type == ev.NODE_CHECKPOINT and e.data["output"]["worker"] == worker)
        or (e.type == ev.NODE_PROGRESS and e.data["message"].startswith(f"{worker} "))
    ]


#: Seconds an event's recorded_at (its transaction's start) may precede the moment its statement judged.
RECORDED_AT_SLACK = 0.25


def lease_lapses_at(store: EventStore, run_id: uuid.UUID) -> float:
    """When the node's lease, as last renewed, lapses (the server's clock, epoch seconds)."""
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM lease_expires_at)::float8 FROM ledgerflow.workflow_queue "
            "WHERE run_id = %s AND node = 'work'",
            (run_id,),
        ).fetchone()
    assert row is not None
    assert row[0] is not None
    return float(row[0])


def test_a_worker_cut_off_mid_node_is_taken_over_fenced_and_rejoins(
    store: EventStore, hosts: tuple[netns.Host, netns.Host], tmp_path: Path
) -> None:
    cut_host, peer_host = hosts
    engine = Engine(store, registry)
    gate = tmp_path / "gate"
    started: list[Worker] = []
    with (
        netns.reachable_database(cut_host, store.url) as cut_url,
        netns.reachable_database(peer_host, store.url) as peer_url,
    ):
        try:
            cut = Worker("cut", cut_host, cut_url, tmp_path, gate)
            started.append(cut)
            run_id = engine.start("partitioned").run_id
            wait_until(
                lambda: len(of_type(run_events(store, run_id), ev.NODE_CHECKPOINT)) >= 5,
                timeout=60,
                what="the worker to be well into the node",
            )
            # Started only now, so that the node is the first worker's.
            peer = Worker("peer", peer_host, peer_url, tmp_path, gate)
            started.append(peer)
            wait_until(lambda: peer.logged("workflow_presence_registered"), timeout=30, what="the peer")

            # -- the cut: the node is taken over once its lease lapses ---------------------------------
            cut_at = time.monotonic()
            cut_host.cut()
            lapses_at = lease_lapses_at(store, run_id)
            claimed = wait_until(
                lambda: of_type(run_events(store, run_id), ev.NODE_CLAIMED)[1:],
                timeout=4 * LEASE,
                what="the node to be taken over",
            )
            taken_after = time.monotonic() - cut_at
            wait_until(
                lambda: len(writes_of(run_events(store, run_id), claimed[0].data["worker"])) >= 5,
                timeout=30,
                what="the peer to go on with the node",
            )
            # The partition lasts until the cut-off worker has noticed it: within its connections'
            # TCP timeouts (eventstore.db.NETWORK_TIMEOUTS), not the kernel's quarter of an hour.
            wait_until(lambda: cut.logged("database_unavailable"), timeout=20, what="the cut to be noticed")
            noticed_after = time.monotonic() - cut_at

            # -- healed: the cut-off worker's writes for the node are refused; it rejoins -----------------
            healed_at = time.monotonic()
            cut_host.heal()
            wait_until(
                lambda: cut.logged("workflow_node_lease_lost") or cut.logged("workflow_node_interrupted"),
                timeout=30,
                what="the cut-off worker to find its node gone",
            )
            wait_until(lambda: cut.logged("database_available_again"), timeout=30, what="the outage to end")
            rejoined_after = time.monotonic() - healed_at
            gate.touch()
            wait_until(
                lambda: of_type(run_events(store, run_id), ev.RUN_COMPLETED),
                timeout=30,
                what="the run to finish",
            )
            # Only the rejoined worker is left to run new work.
            peer.stop()
            quick_runs = [engine.start("after_partition").run_id for _ in range(3)]
            wait_until(
                lambda: all(of_type(run_events(store, r), ev.RUN_COMPLETED) for r in quick_runs),
                timeout=30,
                what="the rejoined worker to run new work",
            )
        finally:
            for w in started:
                w.stop()

    events = run_events(store, run_id)
    first, second = of_type(events, ev.NODE_CLAIMED)
    cut_id, peer_id = first.data["worker"], second.data["worker"]
    assert (cut_id.split("/")[0], peer_id.split("/")[0]) == ("cut", "peer")
    (reclaimed,) = of_type(events, ev.NODE_RECLAIMED)
    assert reclaimed.data["reason"] == "lease_expired", "its session lives on: only the lease ends it"
    # An event's recorded_at is its transaction's start, and the reclaim's statement looks at the lease's
    # end a moment later (on clock_timestamp()): it was seen 15 µs early by that reading alone. A takeover
    # before the lease's end, the failure this looks for, would come a TTL early, not milliseconds.
    assert reclaimed.recorded_at.timestamp() >= lapses_at - RECORDED_AT_SLACK, (
        "taken over before its lease lapsed"
    )
    assert reclaimed.recorded_at.timestamp() - lapses_at < LEASE + 2.0

    # Fencing: the stream's versions order its writes as they committed. Nothing of the first attempt
    # comes after the takeover; the peer's attempt writes only after it.
    takeover = reclaimed.stream_version
    before, after = writes_of(events, cut_id), writes_of(events, peer_id)
    assert before
    assert after
    assert max(e.stream_version for e in before) < takeover < min(e.stream_version for e in after)
    late = [
        e for e in events if e.stream_version > takeover and e.data.get("attempt") == first.data["attempt"]
    ]
    assert late == [], "the cut-off attempt wrote after the takeover"
    released = [e for e in of_type(events, ev.NODE_RELEASED) if e.data["worker"] == cut_id]
    assert released == [], "the cut-off worker handed back a node that was no longer its"
    (succeeded,) = of_type(events, ev.NODE_SUCCEEDED)
    assert succeeded.data["attempt"] == second.data["attempt"]
    assert succeeded.data["output"]["finished_by"] == peer_id

    # Rejoined: it ran every new run, and the outage it reported is over (its last word on the database).
    for r in quick_runs:
        (done_event,) = of_type(run_events(store, r), ev.NODE_SUCCEEDED)
        assert done_event.data["output"] == cut_id
    outage_lines = [
        e["event"] for e in cut.events() if e["event"] in ("database_unavailable", "database_available_again")
    ]
    assert outage_lines[-1] == "database_available_again"
    assert "Traceback" not in cut.log.read_text()

    print(
        f"\npartitioned worker (lease {LEASE:g} s): taken over {taken_after:.2f}s after the cut "
        f"({reclaimed.recorded_at.timestamp() - lapses_at:.2f}s after its lease lapsed); it noticed the "
        f"cut after {noticed_after:.2f}s; back {rejoined_after:.2f}s after the heal; node writes: "
        f"{len(before)} by the cut-off attempt, all before the takeover, {len(after)} by the peer's"
    )

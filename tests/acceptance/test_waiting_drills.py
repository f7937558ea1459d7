"""SIGKILL drills on real `ledgerflow worker` processes while runs sleep and wait for signals.

Runs sleep (a durable timer) and then wait for an approval; signals are sent at random moments, some
before the node waits, some twice with one idempotency key; the worker is killed at random moments and
comes back under the same or another name. Afterwards: every run completed exactly once, with the payload
of its one signal; no memoized step ran again after it was recorded; each signal was taken once; and the
workflow tables equal a rebuild.
"""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path

import pytest

from eventstore import EventStore
from tests.acceptance.drill_workers import sigkill_at_random_moments, start_worker
from tests.acceptance.test_workflow_drills import all_done, assert_tables_equal_rebuild, calls_by_run
from tests.waiting_flows import registry
from workflows import Engine
from workflows import events as ev
from workflows.scheduler import NodeStatus

pytestmark = pytest.mark.drill
FLOWS = "tests.waiting_flows:registry"


def _waiting(engine: Engine, run_ids: list[uuid.UUID]) -> int:
    return sum(
        1 for r in run_ids if any(n.status == NodeStatus.WAITING for n in engine.load(r).nodes.values())
    )


def test_sigkill_while_runs_sleep_and_wait_for_signals(store: EventStore, tmp_path: Path) -> None:
    engine = Engine(store, registry)
    rng = random.Random(7)
    run_ids = [engine.start("patient", input={"nap": rng.uniform(0.2, 1.5)}).run_id for _ in range(16)]
    # A quarter of the approvals arrive before their node waits for them (before it even ran).
    early = set(run_ids[:4])
    for run_id in early:
        engine.signal(run_id, "approve", {"ok": str(run_id)}, idempotency_key="approval")
    log = tmp_path / "workers.log"
    stop_sending = threading.Event()

    def approve_the_rest() -> None:
        # Each approval once the run waits for it, sent twice (a client retrying) with one idempotency key.
        pending = [r for r in run_ids if r not in early]
        while pending and not stop_sending.is_set():
            for run_id in list(pending):
                node = engine.load(run_id).nodes["draft"]
                if node.status == NodeStatus.WAITING and node.waiting_for == "approve":
                    for _ in range(2):
                        engine.signal(run_id, "approve", {"ok": str(run_id)}, idempotency_key="approval")
                    pending.remove(run_id)
            stop_sending.wait(0.05)

    sender = threading.Thread(target=approve_the_rest, daemon=True)
    sender.start()
    try:
        kills = sigkill_at_random_moments(
            store,
            lambda name: start_worker(store.url, name, log, workflows=FLOWS),
            lambda: all_done(engine, run_ids),
            prefix="patient",
            rng=rng,
            most=8,
            pause=0.4,
        )
    finally:
        stop_sending.set()
        sender.join(timeout=10)
    assert kills >= 3
    calls = calls_by_run(store)
    for run_id in run_ids:
        run = engine.load(run_id)
        assert run.status == "succeeded", f"run {run_id} ended {run.status}: {run.error}"
        assert run.nodes["archive"].output == {"ok": str(run_id)}
        assert len(run.signals) == 1, "a repeated approval is recorded once"
        assert run.signals_taken == {0}
        events = store.read_stream(ev.run_stream(run_id), limit=100_000)
        assert sum(e.type == ev.RUN_COMPLETED for e in events) == 1
        recorded = {f"step:{e.data['key']}": e.data["attempt"] for e in events if e.type == ev.STEP_RECORDED}
        for what, attempt in calls[run_id]:
            done_in = recorded.get(what)
            assert done_in is None or attempt <= done_in, (
                f"run {run_id}: {what} ran again in attempt {attempt}"
            )
    assert _waiting(engine, run_ids) == 0
    everything = [e for r in run_ids for e in store.read_stream(ev.run_stream(r), limit=100_000)]
    assert sum(e.type == ev.NODE_WAITING for e in everything) >= len(run_ids), "every run slept at least"
    assert any(e.type == ev.NODE_RECLAIMED for e in everything), "the drill never interrupted a node"
    assert_tables_equal_rebuild(store)

"""A bulk cancel's batch (`workflows.cancelling.cancel_batch`: one queue statement, one multi-stream
append) does to each run what `Engine.cancel` does to it alone, whatever state the run is in."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from eventstore import EventStore, WrongExpectedVersionError
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, RunStateError, node_queue
from workflows.cancelling import cancel_batch
from workflows.run_state import RunState
from workflows.scheduler import NodeStatus
from workflows.testing import running_worker, wait_for_run

STATES = ("running", "claimed", "waiting", "paused", "completed", "cancelled", "being_cancelled")


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def _waiting(engine: Engine, run_id: uuid.UUID) -> bool:
    return engine.load(run_id).node("review").status is NodeStatus.WAITING


def _claim_gated(engine: Engine) -> None:
    """Claim the gated runs' first nodes with no worker to run them: they stay in flight."""
    with engine.store.pool.connection() as conn, conn.transaction():
        node_queue.claim(conn, worker_name="t", instance="t1", workflows=[("gated", "1")], limit=10, ttl=600)


def _twins(engine: Engine) -> dict[str, tuple[uuid.UUID, uuid.UUID]]:
    """Two runs in each state: one for one-run cancels, one for the batch."""
    twins: dict[str, list[uuid.UUID]] = {s: [] for s in STATES}
    with running_worker(engine, registry):
        for _ in range(2):
            twins["waiting"].append(engine.start("approval", input=None).run_id)
            twins["completed"].append(engine.start("linear", input=None).run_id)
        for run_id in twins["completed"]:
            wait_for_run(engine, run_id)
        for run_id in twins["waiting"]:
            wait_until(lambda r=run_id: _waiting(engine, r), what="the approval to wait")  # type: ignore[misc]
    for _ in range(2):
        twins["running"].append(engine.start("linear", input=None).run_id)
        twins["paused"].append(engine.pause(engine.start("linear", input=None).run_id).run_id)
        twins["cancelled"].append(engine.cancel(engine.start("linear", input=None).run_id).run_id)
        twins["claimed"].append(engine.start("gated", input=None).run_id)
    _claim_gated(engine)
    for _ in range(2):
        twins["being_cancelled"].append(engine.start("gated", input=None).run_id)
    _claim_gated(engine)
    for run_id in twins["being_cancelled"]:
        assert engine.cancel(run_id).cancel_requested
    for run_id in twins["claimed"] + twins["being_cancelled"]:
        assert any(n.status is NodeStatus.RUNNING for n in engine.load(run_id).nodes.values())
    return {state: (ids[0], ids[1]) for state, ids in twins.items()}


def _effect(store: EventStore, before: RunState, after: RunState) -> dict[str, Any]:
    """What a cancel did to a run, without its id: its state, the events it appended and its queue rows."""
    appended = [e.type for e in store.read_stream(f"run-{after.run_id}")][before.version :]
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT node, status, cancel_requested FROM ledgerflow.workflow_queue"
            " WHERE run_id = %s ORDER BY node",
            (after.run_id,),
        ).fetchall()
        paused = conn.execute(
            "SELECT 1 FROM ledgerflow.workflow_paused_runs WHERE run_id = %s", (after.run_id,)
        ).fetchone()
    return {
        "status": after.status,
        "cancel_requested": after.cancel_requested,
        "paused": after.paused,
        "appended": appended,
        "queue": [tuple(r) for r in rows],
        "paused_row": paused is not None,
    }


def test_a_batch_cancels_each_run_as_a_one_run_cancel_does(store: EventStore, engine: Engine) -> None:
    twins = _twins(engine)
    one_by_one = {state: pair[0] for state, pair in twins.items()}
    batched = {state: pair[1] for state, pair in twins.items()}
    before = {r: engine.load(r) for r in [*one_by_one.values(), *batched.values()]}

    alone: dict[str, str | None] = {}
    for state, run_id in one_by_one.items():
        try:
            engine.cancel(run_id, actor="bulk:x")
            alone[state] = None
        except RunStateError as exc:
            alone[state] = str(exc).replace(str(run_id), "RUN")
    with engine.transaction() as conn:
        outcome = cancel_batch(
            store, conn, engine.load_many(list(batched.values())), tenant="default", actor="bulk:x"
        )
    together = {
        state: None if outcome[r] is None else str(outcome[r]).replace(str(r), "RUN")
        for state, r in batched.items()
    }

    assert together == alone
    assert {s for s, why in alone.items() if why is not None} == {"completed", "cancelled"}
    for state in STATES:
        a, b = one_by_one[state], batched[state]
        assert _effect(store, before[b], engine.load(b)) == _effect(store, before[a], engine.load(a)), state
    assert engine.load(batched["running"]).status == "cancelled"
    assert engine.load(batched["claimed"]).cancel_requested
    assert engine.load(batched["claimed"]).status == "running"  # its node stops at its next call


def test_a_batch_with_a_run_that_changed_since_it_was_read_writes_nothing(
    store: EventStore, engine: Engine
) -> None:
    runs = [engine.start("linear", input=None).run_id for _ in range(3)]
    read = engine.load_many(runs)
    engine.pause(runs[1])  # after the batch read it: its version moved on
    with pytest.raises(WrongExpectedVersionError), engine.transaction() as conn:
        cancel_batch(store, conn, read, tenant="default", actor="bulk:x")
    assert all(engine.load(r).active and not engine.load(r).cancel_requested for r in runs)
    assert engine.load(runs[1]).paused

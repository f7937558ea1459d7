"""Pairs of runs in each state a run can be in, for tests that compare what an operator action does to one
run alone with what a batch of the same action does to its twin (workflows.cancelling, retrying,
pausing)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from eventstore import EventStore
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, queue_claims
from workflows import events as ev
from workflows.run_state import RunState
from workflows.scheduler import NodeStatus
from workflows.testing import running_worker, wait_for_run

#: The states of `twins`: `running` (ready nodes, none claimed), `claimed` (a node in flight), `waiting`
#: (for a signal), `paused`, `paused_claimed` (paused with a node in flight), `completed`, `failed`,
#: `cancelled`, `cancelled_keyed` (a cancelled run with a run key), `being_cancelled` (a node in flight).
STATES = (
    "running",
    "claimed",
    "waiting",
    "paused",
    "paused_claimed",
    "completed",
    "failed",
    "cancelled",
    "cancelled_keyed",
    "being_cancelled",
)


def _waiting(engine: Engine, run_id: uuid.UUID) -> bool:
    return engine.load(run_id).node("review").status is NodeStatus.WAITING


def _claim_gated(engine: Engine) -> None:
    """Claim the gated runs' first nodes with no worker to run them: they stay in flight."""
    with engine.store.pool.connection() as conn, conn.transaction():
        queue_claims.claim(
            conn, worker_name="t", instance="t1", workflows=[("gated", "1")], limit=10, ttl=600
        )


def twins(engine: Engine, states: Sequence[str] = STATES) -> dict[str, tuple[uuid.UUID, uuid.UUID]]:
    """Two runs in each of `states`: one for one-run actions, one for the batch."""
    made: dict[str, list[uuid.UUID]] = {s: [] for s in STATES}
    with running_worker(engine, registry):
        for _ in range(2):
            made["waiting"].append(engine.start("approval", input=None).run_id)
            made["completed"].append(engine.start("linear", input=None).run_id)
            made["failed"].append(engine.start("bad_output", input=None).run_id)
        for run_id in made["completed"] + made["failed"]:
            wait_for_run(engine, run_id)
        for run_id in made["waiting"]:
            wait_until(lambda r=run_id: _waiting(engine, r), what="the approval to wait")  # type: ignore[misc]
    for i in range(2):
        made["running"].append(engine.start("linear", input=None).run_id)
        made["paused"].append(engine.pause(engine.start("linear", input=None).run_id).run_id)
        made["cancelled"].append(engine.cancel(engine.start("linear", input=None).run_id).run_id)
        keyed = engine.start("linear", input=None, key=f"twin-{uuid.uuid4()}-{i}").run_id
        made["cancelled_keyed"].append(engine.cancel(keyed).run_id)
        made["claimed"].append(engine.start("gated", input=None).run_id)
        made["paused_claimed"].append(engine.start("gated", input=None).run_id)
    _claim_gated(engine)
    for run_id in made["paused_claimed"]:
        assert engine.pause(run_id).paused
    for _ in range(2):
        made["being_cancelled"].append(engine.start("gated", input=None).run_id)
    _claim_gated(engine)
    for run_id in made["being_cancelled"]:
        assert engine.cancel(run_id).cancel_requested
    for run_id in made["claimed"] + made["being_cancelled"] + made["paused_claimed"]:
        assert any(n.status is NodeStatus.RUNNING for n in engine.load(run_id).nodes.values())
    assert all(engine.load(r).status == "failed" for r in made["failed"])
    return {state: (made[state][0], made[state][1]) for state in states}


def effect(store: EventStore, before: RunState, after: RunState) -> dict[str, Any]:
    """What an action did to a run, without its id: its state, the events it appended (types and data but
    for ids, actors and the moment's retention) and its queue rows."""
    appended = [
        (e.type, {k: v for k, v in e.data.items() if k not in ("run_id", "actor", "retention_seconds")})
        for e in store.read_stream(ev.run_stream(after.run_id))
    ][before.version :]
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT node, status, cancel_requested, attempt, crashes FROM ledgerflow.workflow_queue"
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

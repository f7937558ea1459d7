"""Children follow their parent: cancelling, failing or pausing a run does the same to the runs its nodes
started, by each child's parent-close policy (`cancel`, `terminate`, `abandon`), recursively, through the
children's own events; resuming it resumes them."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from eventstore import EventStore
from projector import ProjectorWorker, WorkerSettings, rebuild
from tests.children_flows import GATES, registry
from tests.integration.test_workflows_control import FAST
from tests.waiting import wait_until
from workflows import Engine, WorkflowWorker
from workflows import event_models as em
from workflows import events as ev
from workflows.children import children_projection
from workflows.run_state import RunState


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    w = WorkflowWorker(Engine(engine.store, registry), registry, FAST, name="children")
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    for gate in GATES.values():
        gate.set()
    w.stop()
    thread.join(timeout=15)
    GATES.clear()


def children(engine: Engine, run_id: uuid.UUID) -> dict[str, uuid.UUID]:
    """The parent's children by policy (their child keys), as its node recorded them."""
    run = engine.load(run_id)
    return {k: uuid.UUID(v) for n in run.nodes.values() for k, v in n.children.items()}


def status(engine: Engine, run_id: uuid.UUID) -> RunState:
    return engine.load(run_id)


def running(engine: Engine, run_id: uuid.UUID, node: str) -> bool:
    return engine.load(run_id).node(node).status == "running"


def test_cancelling_a_run_cancels_three_levels_of_children(engine: Engine, worker: WorkflowWorker) -> None:
    root = engine.start("tree", input={"depth": 2}).run_id
    child = wait_until(lambda: children(engine, root).get("cancel"), what="the child")
    grandchild = wait_until(lambda: children(engine, child).get("cancel"), what="the grandchild")
    wait_until(
        lambda: engine.load(grandchild).node("spawn").status == "waiting", what="the grandchild waiting"
    )
    # Each child's state names its parent (the link its start recorded); the root has none.
    assert (engine.load(root).parent_run_id, engine.load(grandchild).parent_run_id) == (None, child)
    link = engine.load(child).parent
    assert link is not None
    assert (link.run_id, link.parent_close) == (str(root), "cancel")
    engine.cancel(root)
    for run_id in (root, child, grandchild):
        run = wait_until(
            lambda r=run_id: (s := status(engine, r)).status == "cancelled" and s, what=f"{run_id}"
        )
        assert run.status == "cancelled"
    requested = [
        e for e in engine.store.read_stream(ev.run_stream(grandchild)) if e.type == ev.RUN_CANCEL_REQUESTED
    ]
    assert [e.data["actor"] for e in requested] == [f"parent:{child}"]


def test_each_policy_on_pause_resume_and_cancel(engine: Engine, worker: WorkflowWorker) -> None:
    root = engine.start("held", input={"policies": ["cancel", "terminate", "abandon"]}).run_id
    kids = wait_until(lambda: len(c := children(engine, root)) == 3 and c, what="three children")
    for kid in kids.values():
        wait_until(lambda k=kid: running(engine, k, "work"), what="each child running")

    engine.pause(root)
    wait_until(lambda: status(engine, kids["cancel"]).paused, what="the cancel child paused")
    # `terminate`: paused with its running node interrupted (handed back, held while paused).
    wait_until(
        lambda: status(engine, kids["terminate"]).node("work").status == "ready", what="the node handed back"
    )
    assert status(engine, kids["terminate"]).paused
    assert running(engine, kids["cancel"], "work")  # `cancel`: its running node goes on
    assert status(engine, kids["abandon"]).status == "running"

    engine.resume(root)
    wait_until(lambda: not status(engine, kids["cancel"]).paused, what="the cancel child resumed")
    wait_until(lambda: running(engine, kids["terminate"], "work"), what="the terminate child running again")

    engine.cancel(root)
    # `terminate`: ended at once, its running node not let finish; `cancel`: its node stops at its next call.
    for policy in ("terminate", "cancel"):
        wait_until(lambda p=policy: status(engine, kids[p]).status == "cancelled", what=f"the {policy} child")
    assert status(engine, kids["abandon"]).status == "running"
    GATES.setdefault(str(kids["abandon"]), threading.Event()).set()
    wait_until(
        lambda: status(engine, kids["abandon"]).status == "succeeded", what="the abandoned child to end"
    )


def test_a_failed_run_cancels_its_children(engine: Engine, worker: WorkflowWorker) -> None:
    root = engine.start("held", input={"policies": ["cancel"], "fail": True}).run_id
    wait_until(lambda: status(engine, root).status == "failed", what="the parent to fail")
    kid = children(engine, root)["cancel"]
    wait_until(lambda: status(engine, kid).status == "cancelled", what="the child cancelled")


def test_a_child_started_after_its_parent_was_cancelled_is_cancelled_once(engine: Engine) -> None:
    parent = engine.start("busy").run_id
    engine.cancel(parent)
    link = em.ParentLink(run_id=str(parent), node="work", parent_close="cancel")
    child = engine.start("busy", parent=link, idempotency_key="late-child").run_id
    follower = ProjectorWorker(engine.store, [children_projection(engine)], WorkerSettings(lease_ttl=60))
    try:
        follower.run_until_caught_up()
        assert status(engine, child).status == "cancelled"
        # Applied again (a replay, or a crash before the cursor's commit): nothing more is recorded.
        before = len(engine.store.read_stream(ev.run_stream(child)))
        rebuild(engine.store, children_projection(engine))
        assert len(engine.store.read_stream(ev.run_stream(child))) == before
    finally:
        follower.release_all()


def test_a_run_its_last_running_node_ends_while_paused_keeps_no_pause(
    engine: Engine, worker: WorkflowWorker
) -> None:
    run_id = engine.start("held", input={}).run_id
    wait_until(lambda: running(engine, run_id, "hold"), what="the node to run")
    engine.pause(run_id)
    GATES.setdefault(str(run_id), threading.Event()).set()
    wait_until(lambda: status(engine, run_id).status == "succeeded", what="the run to end")

    def pauses() -> int:
        with engine.store.pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM ledgerflow.workflow_paused_runs").fetchone()
        assert row is not None
        return int(row[0])

    # Dropped by the worker just after the end committed.
    wait_until(lambda: pauses() == 0, what="the pause row to go")

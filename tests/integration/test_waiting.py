"""Nodes that wait: durable timers and signals. A waiting node holds no worker thread, wakes on any worker
when its wait ends, and its body runs again from the start with steps and ended waits answered from the
log, so nothing it paid for is paid again."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from eventstore import EventStore, IdempotencyConflictError, InvalidInputError, NotFoundError
from tests.waiting import wait_until
from tests.worker_threads import StartWorker, worker_threads
from workflows import (
    Engine,
    RetryPolicy,
    RunStateError,
    Workflow,
    WorkflowRegistry,
)
from workflows import events as ev
from workflows.context import NodeContext
from workflows.errors import SignalTimeout
from workflows.scheduler import NodeStatus

#: What the node bodies did, by run id: a list of labels, appended as they happen.
CALLS: dict[str, list[str]] = {}
_lock = threading.Lock()


def _note(ctx: NodeContext, what: str) -> None:
    with _lock:
        CALLS.setdefault(str(ctx.run_id), []).append(what)


registry = WorkflowRegistry()

sleepy = Workflow("sleepy")


@sleepy.node()
def nap(ctx: NodeContext) -> dict[str, Any]:
    _note(ctx, "body")
    paid = ctx.step("paid", lambda: _note(ctx, "paid") or "receipt")
    ctx.sleep(ctx.input["seconds"])
    _note(ctx, "woke")
    return {"paid": paid}


@sleepy.node(depends_on=["nap"])
def after_nap(ctx: NodeContext) -> str:
    return "done"


approval = Workflow("approval")


@approval.node()
def draft(ctx: NodeContext) -> str:
    return ctx.step("draft", lambda: _note(ctx, "drafted") or "text")


@approval.node(depends_on=["draft"])
def review(ctx: NodeContext) -> Any:
    timeout = ctx.input.get("timeout") if isinstance(ctx.input, dict) else None
    try:
        decision = ctx.wait_for_signal("approve", timeout=timeout)
    except SignalTimeout:
        _note(ctx, "timed out")
        return {"approved": None}
    _note(ctx, f"got {decision}")
    return decision


pair = Workflow("pair")


@pair.node()
def first(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("go")


@pair.node()
def second(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("go")


@pair.node(depends_on=["first", "second"])
def both(ctx: NodeContext) -> Any:
    return sorted([ctx.outputs["first"]["n"], ctx.outputs["second"]["n"]])


napper = Workflow("napper")


@napper.node(retry=RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.01))
def naps_then_fails_once(ctx: NodeContext) -> dict[str, int]:
    ctx.sleep(0.05)
    ctx.sleep(0.05)
    _note(ctx, f"attempt {ctx.attempt}")
    if ctx.attempt == 1:
        raise RuntimeError("the first try fails after its naps")
    return {"attempt": ctx.attempt}


misnamed = Workflow("misnamed")


@misnamed.node(retry=RetryPolicy(max_attempts=1))
def waits_for_what_nobody_can_send(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("not a name!")


for wf in (sleepy, approval, pair, napper, misnamed):
    registry.register(wf)


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def start_worker(store: EventStore) -> Iterator[StartWorker]:
    with worker_threads(store, registry) as start:
        yield start
    CALLS.clear()


def _node(engine: Engine, run_id: uuid.UUID, node: str) -> Any:
    return engine.load(run_id).nodes[node]


def _finished(engine: Engine, run_id: uuid.UUID) -> bool:
    return not engine.load(run_id).active


def test_a_sleeping_node_holds_no_thread_and_wakes_after_its_time(engine: Engine, start_worker: Any) -> None:
    worker = start_worker()
    # Twice as many sleepers as the worker has threads: they all sleep at once, so none holds one.
    runs = [engine.start("sleepy", input={"seconds": 3}).run_id for _ in range(4)]
    wait_until(lambda: all(_node(engine, r, "nap").status == NodeStatus.WAITING for r in runs), timeout=20)
    # A waiting node holds no worker slot (the slot is let go just after the wait is recorded), while every
    # node still sleeps.
    # (Up to the 3 s sleep: past it the nodes wake, and the check below could no longer hold.)
    wait_until(lambda: not worker._running, timeout=3, what="the worker's slots to be free")
    assert all(_node(engine, r, "nap").status == NodeStatus.WAITING for r in runs)
    started = time.monotonic()
    wait_until(lambda: all(_finished(engine, r) for r in runs), timeout=30)
    # Woken by their timers, not left asleep (a margin over the 3 s for a loaded machine).
    assert time.monotonic() - started < 15
    for r in runs:
        run = engine.load(r)
        assert run.status == "succeeded"
        assert CALLS[str(r)].count("paid") == 1, "the step before the sleep is paid once"
        assert CALLS[str(r)].count("woke") == 1
        nap_node = run.nodes["nap"]
        woke_at = nap_node.finished_at
        assert woke_at is not None
        assert nap_node.started_at is not None
        assert woke_at >= next(iter(nap_node.waits.values())), "not before its due time"  # type: ignore[operator]


def test_a_timer_survives_every_worker_stopping(engine: Engine, start_worker: Any) -> None:
    first = start_worker("w1")
    run_id = engine.start("sleepy", input={"seconds": 2}).run_id
    wait_until(lambda: _node(engine, run_id, "nap").status == NodeStatus.WAITING, timeout=20)
    first.stop()
    due = next(iter(_node(engine, run_id, "nap").waits.values()))
    start_worker("w2")  # a new worker knows nothing of the timer but the log and the queue
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "succeeded"
    assert run.nodes["nap"].finished_at >= due
    assert CALLS[str(run_id)].count("paid") == 1


def test_a_signal_sent_while_the_node_waits_wakes_it(engine: Engine, start_worker: Any) -> None:
    start_worker()
    run_id = engine.start("approval").run_id
    wait_until(lambda: _node(engine, run_id, "review").status == NodeStatus.WAITING, timeout=20)
    node = _node(engine, run_id, "review")
    assert node.waiting_for == "approve"
    assert node.wake_at is None
    sent = engine.signal(run_id, "approve", {"approved": True, "by": "ann"}, idempotency_key="k1")
    assert not sent.duplicate
    again = engine.signal(run_id, "approve", {"approved": True, "by": "ann"}, idempotency_key="k1")
    assert again.duplicate
    assert again.position == sent.position
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "succeeded"
    assert run.nodes["review"].output == {"approved": True, "by": "ann"}
    assert len(run.signals) == 1, "a repeat with the same idempotency key is recorded once"
    assert CALLS[str(run_id)].count("drafted") == 1


def test_a_signal_sent_before_the_node_waits_is_kept_for_it(engine: Engine, start_worker: Any) -> None:
    run_id = engine.start("approval").run_id
    engine.signal(run_id, "approve", {"approved": False})
    start_worker()
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.nodes["review"].output == {"approved": False}
    assert not any(e.type == ev.NODE_WAITING for e in engine.store.read_stream(ev.run_stream(run_id))), (
        "the node never had to wait"
    )


def test_a_signal_wait_times_out_with_a_typed_error(engine: Engine, start_worker: Any) -> None:
    start_worker()
    run_id = engine.start("approval", input={"timeout": 0.5}).run_id
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.nodes["review"].output == {"approved": None}
    assert CALLS[str(run_id)].count("timed out") == 1
    # A signal after the timeout is kept in the log, but the ended wait keeps its answer.
    with pytest.raises(RunStateError):
        engine.signal(run_id, "approve", {"approved": True})


def test_each_signal_is_taken_by_exactly_one_wait(engine: Engine, start_worker: Any) -> None:
    start_worker("w1")
    start_worker("w2")
    for _ in range(5):
        run_id = engine.start("pair").run_id
        engine.signal(run_id, "go", {"n": 1})
        engine.signal(run_id, "go", {"n": 2})
        wait_until(lambda run_id=run_id: _finished(engine, run_id), timeout=20)  # type: ignore[misc]
        assert engine.load(run_id).nodes["both"].output == [1, 2]


def _writes(engine: Engine) -> tuple[int, ...]:
    """Events, idempotency keys, and the last log position handed out (a rolled-back append moves it too)."""
    with engine.store.pool.connection() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM ledgerflow.events),"
            " (SELECT count(*) FROM ledgerflow.idempotency_keys),"
            " coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledgerflow.events', 'position')), 0)"
        ).fetchone()
    assert row is not None
    return tuple(int(v) for v in row)


def test_a_repeat_after_the_run_ended_reads_the_first_send_and_writes_nothing(engine: Engine) -> None:
    run_id = engine.start("approval").run_id
    sent = engine.signal(run_id, "approve", {"approved": True}, idempotency_key="k1")
    assert not sent.duplicate
    assert engine.cancel(run_id).status == "cancelled"
    before = _writes(engine)
    again = engine.signal(run_id, "approve", {"approved": True}, idempotency_key="k1")
    assert again.duplicate
    assert again.position == sent.position, "the first send's answer"
    with pytest.raises(IdempotencyConflictError):
        engine.signal(run_id, "approve", {"approved": False}, idempotency_key="k1")
    with pytest.raises(RunStateError, match="ended"):
        engine.signal(run_id, "approve", {"approved": True}, idempotency_key="k2")
    assert _writes(engine) == before, "no event, key or log position was taken, not even for a moment"
    assert len(engine.load(run_id).signals) == 1


def test_signals_are_checked(engine: Engine) -> None:
    run_id = engine.start("approval").run_id
    with pytest.raises(InvalidInputError):
        engine.signal(run_id, "not a name!", {})
    with pytest.raises(InvalidInputError):
        engine.signal(run_id, "approve", {"x": float("nan")})
    with pytest.raises(NotFoundError):
        engine.signal(uuid.uuid4(), "approve", {})
    with pytest.raises(NotFoundError):
        engine.signal(run_id, "approve", {}, tenant="someone_else")
    assert engine.load(run_id).signals == [], "refused signals leave the log untouched"


def test_sleep_until_needs_a_time_zone() -> None:
    # Checked before the context is used: a naive datetime is refused whatever the node's state.
    with pytest.raises(InvalidInputError, match="time zone"):
        NodeContext.sleep_until(None, datetime(2030, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="finite"):
        NodeContext.sleep(None, float("inf"))  # type: ignore[arg-type]


def test_the_run_list_says_what_a_run_waits_for(engine: Engine, start_worker: Any) -> None:
    from projector import ProjectorWorker
    from projector import WorkerSettings as ProjectorSettings
    from workflows import list_runs, run_nodes, workflow_tables

    start_worker()
    run_id = engine.start("approval").run_id
    wait_until(lambda: _node(engine, run_id, "review").status == NodeStatus.WAITING, timeout=20)
    projector = ProjectorWorker(engine.store, [workflow_tables], ProjectorSettings())
    try:
        projector.run_until_caught_up()
    finally:
        projector.release_all()
    (listed,) = [r for r in list_runs(engine.store, tenant="default") if r["run_id"] == run_id]
    assert listed["waiting"] == "signal approve"
    review = next(n for n in run_nodes(engine.store, run_id) if n["node"] == "review")
    assert review["status"] == "waiting"
    assert review["waiting_for"] == "approve"
    assert review["wake_at"] is None


def test_a_wait_for_a_signal_nobody_can_send_fails_the_node_at_once(
    engine: Engine, start_worker: Any
) -> None:
    start_worker()
    run_id = engine.start("misnamed").run_id
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "failed"
    assert "invalid signal name" in (run.error or "")
    assert not any(e.type == ev.NODE_WAITING for e in engine.store.read_stream(ev.run_stream(run_id)))


def test_a_wake_goes_on_with_the_same_attempt_and_is_counted_apart(engine: Engine, start_worker: Any) -> None:
    """Waits are not tries: two naps leave the first try at attempt 1, and its failure's retry is attempt
    2 (whose naps, ended already, are answered from the log); the two wakes are counted apart."""
    start_worker()
    run_id = engine.start("napper").run_id
    wait_until(lambda: _finished(engine, run_id), timeout=30, what="the run to end")
    run = engine.load(run_id)
    node = run.nodes["naps_then_fails_once"]
    assert run.status == "succeeded", node.error
    assert node.output == {"attempt": 2}
    assert CALLS[str(run_id)] == ["attempt 1", "attempt 2"]
    assert (node.attempt, node.wakes, node.failures) == (2, 2, 1)
    claimed = [
        e.data["attempt"]
        for e in engine.store.read_stream(ev.run_stream(run_id))
        if e.type == ev.NODE_CLAIMED
    ]
    assert claimed == [1, 1, 1, 2]

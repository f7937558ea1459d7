"""Control over runs: cancel, retry, refresh, stuck detection, crash-loop parking, resuming from
checkpoints, child runs started once, and races between starters and claimers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from eventstore import EventStore
from tests.flows import CRASH_AFTER, GATES, registry
from tests.waiting import joined, wait_until
from workflows import (
    Engine,
    NodeLeaseLost,
    RunStateError,
    WorkerSettings,
    Workflow,
    WorkflowRegistry,
    WorkflowWorker,
    queue_status,
)
from workflows import events as ev
from workflows.context import NodeContext
from workflows.recovery import sweep
from workflows.run_state import RunState

FAST = WorkerSettings(
    concurrency=4,
    lease_ttl=1.0,
    heartbeat_interval=0.2,
    recovery_interval=0.2,
    poll_interval=0.05,
    shutdown_grace=1,
)


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


class Workers:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.started: list[tuple[WorkflowWorker, threading.Thread]] = []

    def start(self, name: str = "w1", reg: WorkflowRegistry = registry) -> WorkflowWorker:
        worker = WorkflowWorker(Engine(self.engine.store, reg), reg, FAST, name=name)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.started.append((worker, thread))
        return worker

    def stop_all(self) -> None:
        for worker, thread in self.started:
            worker.stop()
            thread.join(timeout=15)


@pytest.fixture
def workers(engine: Engine) -> Iterator[Workers]:
    w = Workers(engine)
    yield w
    for gate in GATES.values():
        gate.set()
    w.stop_all()
    GATES.clear()
    CRASH_AFTER.clear()


def ended(engine: Engine, run_id: uuid.UUID) -> RunState | None:
    run = engine.load(run_id)
    return None if run.active else run


def calls(store: EventStore, run_id: uuid.UUID) -> list[tuple[str, int]]:
    with store.pool.connection() as conn:
        if conn.execute("SELECT to_regclass('public.calls')").fetchone() == (None,):
            return []
        rows = conn.execute("SELECT what, attempt FROM public.calls WHERE run_id = %s ORDER BY at", (run_id,))
        return [(r[0], r[1]) for r in rows.fetchall()]


def test_cancel_stops_the_running_node_and_pending_nodes_never_start(
    engine: Engine, workers: Workers
) -> None:
    workers.start()
    run_id = engine.start("gated").run_id
    wait_until(
        lambda: engine.load(run_id).node("wait_gate").status == "running", what="the gated node to run"
    )
    engine.cancel(run_id)
    run = wait_until(lambda: ended(engine, run_id), what="the run to end")
    assert run.status == "cancelled"
    assert run.node("wait_gate").status == "cancelled"
    assert run.node("after_gate").status == "pending"
    assert calls(engine.store, run_id) == []
    with pytest.raises(RunStateError):
        engine.cancel(run_id)


def test_cancel_of_a_waiting_run_ends_it_at_once(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    run = engine.cancel(run_id)
    assert run.status == "cancelled"
    assert run.node("first").status == "cancelled"
    with engine.store.pool.connection() as conn:
        assert queue_status.summary(conn).ready == 0


def test_retry_after_cancel_runs_the_rest(engine: Engine, workers: Workers) -> None:
    run_id = engine.start("linear").run_id
    engine.cancel(run_id)
    engine.retry(run_id)
    workers.start()
    run = wait_until(lambda: ended(engine, run_id), what="the retried run to end")
    assert run.status == "succeeded"


def test_refresh_reruns_only_what_changed(engine: Engine, workers: Workers) -> None:
    workers.start()
    run_id = engine.start("linear", input={"n": 3}).run_id
    wait_until(lambda: ended(engine, run_id), what="the first run")
    assert engine.refresh(run_id, input={"n": 3}) == set()

    # New code for `third` only: a registry where third has a new code version.
    changed = Workflow("linear")
    for name, spec in registry.get("linear").nodes.items():
        changed.node(name=name, depends_on=spec.depends_on, code_version="2" if name == "third" else "1")(
            spec.fn
        )
    new_registry = WorkflowRegistry()
    new_registry.register(changed)
    workers.stop_all()
    workers.start("w2", new_registry)
    assert Engine(engine.store, new_registry).refresh(run_id, input={"n": 3}) == {"third"}
    wait_until(lambda: ended(engine, run_id), what="the refreshed run")
    assert [c for c in calls(engine.store, run_id) if c[0] != "third"] == [("first", 1), ("second", 1)]
    assert [c for c in calls(engine.store, run_id) if c[0] == "third"] == [("third", 1), ("third", 2)]

    # New input changes the root, so everything downstream runs again.
    assert Engine(engine.store, new_registry).refresh(run_id, input={"n": 4}) == {"first", "second", "third"}
    run = wait_until(lambda: ended(engine, run_id), what="the run refreshed with new input")
    assert run.node("third").output == {"n": 9}


def test_a_crashed_node_resumes_from_its_last_checkpoint(engine: Engine, workers: Workers) -> None:
    run_id = engine.start("resumable").run_id
    CRASH_AFTER[str(run_id)] = 6
    workers.start()
    run = wait_until(lambda: ended(engine, run_id), timeout=30, what="the run to finish after the crash")
    assert run.status == "succeeded"
    assert run.node("items").output == {"setup": "ready", "sum": 550}
    made = calls(engine.store, run_id)
    assert [c for c in made if c[0] == "step:setup"] == [("step:setup", 1)]  # the memoized step: paid once
    assert [int(w.split(":")[1]) for w, a in made if w.startswith("item:") and a == 1] == list(range(1, 7))
    assert [int(w.split(":")[1]) for w, a in made if w.startswith("item:") and a == 2] == list(range(7, 11))
    reclaims = [e for e in engine.store.read_stream(ev.run_stream(run_id)) if e.type == ev.NODE_RECLAIMED]
    assert len(reclaims) == 1


def test_a_node_crashing_too_often_is_parked_for_an_operator(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    crasher = WorkflowWorker(engine, registry, FAST, name="crasher")
    for _ in range(6):  # max_crashes is 5: the sixth crash parks the node
        assert len(crasher._claim(1)) == 1
        with engine.store.pool.connection() as conn:
            conn.execute("UPDATE ledgerflow.workflow_queue SET lease_expires_at = clock_timestamp()")
        sweep(engine, registry, worker_name="recoverer", instance="r1")
    run = engine.load(run_id)
    assert run.node("first").status == "parked"
    assert run.node("first").crashes == 6
    with engine.store.pool.connection() as conn:
        assert queue_status.summary(conn).parked == 1
        assert crasher._claim(1) == []  # parked nodes are not handed out
    engine.retry(run_id)
    assert engine.load(run_id).node("first").status == "ready"


def test_a_stuck_node_is_flagged_and_retried(engine: Engine, workers: Workers) -> None:
    workers.start()
    run_id = engine.start("stuck").run_id
    run = wait_until(lambda: ended(engine, run_id), timeout=30, what="the stuck run to finish")
    assert run.status == "succeeded"
    assert run.node("silent_retry").output == 2
    types = [e.type for e in engine.store.read_stream(ev.run_stream(run_id))]
    assert ev.NODE_STUCK in types
    assert ev.NODE_RECLAIMED in types


def test_a_stuck_node_fails_by_policy(engine: Engine, workers: Workers) -> None:
    workers.start()
    run_id = engine.start("stuck_fail").run_id
    run = wait_until(lambda: ended(engine, run_id), timeout=30, what="the stuck run to fail")
    assert run.status == "failed"
    assert "NodeStuckError" in (run.node("silent_fail").error or "")


def test_a_child_workflow_is_started_once_however_often_the_node_retries(
    engine: Engine, workers: Workers
) -> None:
    workers.start()
    run_id = engine.start("parent").run_id
    run = wait_until(lambda: ended(engine, run_id), timeout=30, what="the parent run")
    assert run.status == "succeeded"
    assert run.node("spawn").attempt == 2
    child_id = uuid.UUID(run.node("spawn").output)
    with engine.store.pool.connection() as conn:
        children = conn.execute(
            "SELECT data->>'run_id' FROM ledgerflow.events "
            "WHERE event_type = 'wf.RunStarted' AND data->>'workflow' = 'linear'"
        ).fetchall()
    assert [uuid.UUID(r[0]) for r in children] == [child_id]


def test_concurrent_starts_for_one_key_give_one_run(engine: Engine) -> None:
    barrier = threading.Barrier(8, timeout=60)
    results = []

    def start() -> None:
        barrier.wait()
        results.append(engine.start("linear", key="the-key"))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    assert len({r.run_id for r in results}) == 1
    assert sum(r.created for r in results) == 1


def test_racing_claimers_get_each_node_once(engine: Engine) -> None:
    for _ in range(30):
        engine.start("diamond")
    claimers = [WorkflowWorker(engine, registry, FAST, name=f"c{i}") for i in range(6)]
    barrier = threading.Barrier(len(claimers), timeout=60)
    claimed: list[tuple[uuid.UUID, str]] = []

    def claim(worker: WorkflowWorker) -> None:
        barrier.wait()
        while batch := worker._claim(3):
            claimed.extend((c.run_id, c.node) for c in batch)

    threads = [threading.Thread(target=claim, args=(w,)) for w in claimers]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    assert len(claimed) == 30
    assert len(set(claimed)) == 30


def test_a_reclaimed_claim_cannot_write(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    stale_worker = WorkflowWorker(engine, registry, FAST, name="stale")
    (claim,) = stale_worker._claim(1)
    run = engine.load(run_id)
    ctx = NodeContext(
        engine, run, claim, registry.get("linear").nodes["first"], worker="stale", stopping=threading.Event()
    )
    ctx.progress(1, 3, "before the pause")
    with engine.store.pool.connection() as conn:
        conn.execute("UPDATE ledgerflow.workflow_queue SET lease_expires_at = clock_timestamp()")
    sweep(engine, registry, worker_name="recoverer", instance="r1")
    version = engine.load(run_id).version
    with pytest.raises(NodeLeaseLost):
        ctx.progress(3, 3, "after the pause")
    with pytest.raises(NodeLeaseLost):
        stale_worker.lifecycle.succeeded(claim, registry.get("linear"), {"n": 1}, 0.1)
    assert engine.load(run_id).version == version


def test_an_output_that_cannot_be_recorded_fails_the_node_instead_of_crash_looping(
    engine: Engine, workers: Workers
) -> None:
    workers.start()
    run_id = engine.start("bad_output").run_id
    run = wait_until(lambda: ended(engine, run_id), timeout=30, what="the run to fail")
    assert run.status == "failed"
    assert "not valid JSON" in (run.node("unrecordable").error or "")
    assert run.node("unrecordable").crashes == 0


def test_a_restarted_worker_takes_its_own_nodes_back_at_once(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    before = WorkflowWorker(engine, registry, WorkerSettings(lease_ttl=3600), name="host-a")
    assert len(before._claim(1)) == 1  # then the process "dies": its lease would last an hour
    after = WorkflowWorker(engine, registry, WorkerSettings(lease_ttl=3600), name="host-a")
    report = sweep(engine, registry, worker_name=after.name, instance=after.instance, trigger="startup")
    assert report.reclaimed == 1
    reclaimed = [e for e in engine.store.read_stream(ev.run_stream(run_id)) if e.type == ev.NODE_RECLAIMED]
    assert [e.data["reason"] for e in reclaimed] == ["worker_restarted"]
    # Another worker's live lease is left alone.
    other = WorkflowWorker(engine, registry, WorkerSettings(lease_ttl=3600), name="host-b")
    assert len(other._claim(1)) == 1
    assert sweep(engine, registry, worker_name="host-c", instance="c1").reclaimed == 0
    with engine.store.pool.connection() as conn:
        (latest,) = queue_status.recent_recoveries(conn, 1)
    assert (latest.trigger, latest.reclaimed) == ("startup", 1)


def test_a_stopping_worker_hands_its_node_over_at_once(engine: Engine, workers: Workers) -> None:
    first = workers.start("first")
    run_id = engine.start("gated").run_id
    wait_until(lambda: engine.load(run_id).node("wait_gate").status == "running", what="the node to start")
    first.stop()
    wait_until(
        lambda: any(e.type == ev.NODE_RELEASED for e in engine.store.read_stream(ev.run_stream(run_id))),
        what="the node to be handed back",
    )
    workers.start("second")
    wait_until(
        lambda: (engine.load(run_id).node("wait_gate").worker or "").startswith("second/"),
        what="the second worker to take the node",
    )
    GATES[str(run_id)].set()
    run = wait_until(lambda: ended(engine, run_id), what="the run to finish")
    assert run.status == "succeeded"
    assert run.node("wait_gate").crashes == 0  # a hand-over is not a crash

"""Pausing and resuming a run: a paused run starts no new node, its running nodes finish or are handed
back, and the resume goes on where it was, without running a completed node or a memoized step again."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from eventstore import EventStore, NotFoundError
from projector import ProjectorWorker, WorkerSettings, verify
from tests.flows import CRASH_AFTER, GATES, registry
from tests.integration.test_workflows_control import Workers, calls, ended
from tests.waiting import joined, wait_until
from workflows import Engine, RunStateError, queue_claims, workflow_tables
from workflows import events as ev


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def workers(engine: Engine) -> Iterator[Workers]:
    w = Workers(engine)
    yield w
    for gate in GATES.values():
        gate.set()
    w.stop_all()
    GATES.clear()
    CRASH_AFTER.clear()


def queue_rows(store: EventStore, run_id: uuid.UUID) -> dict[str, str]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT node, status FROM ledgerflow.workflow_queue WHERE run_id = %s", (run_id,)
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def types(store: EventStore, run_id: uuid.UUID) -> list[str]:
    return [e.type for e in store.read_stream(ev.run_stream(run_id))]


def claim_all(engine: Engine) -> list[queue_claims.Claim]:
    with engine.store.pool.connection() as conn:
        conn.autocommit = True
        return queue_claims.claim(
            conn, worker_name="t", instance="t1", workflows=registry.name_versions(), limit=50, ttl=30
        )


def test_a_paused_run_lets_its_running_node_finish_and_starts_no_other_until_resumed(
    engine: Engine, workers: Workers
) -> None:
    workers.start()
    run_id = engine.start("gated").run_id
    wait_until(
        lambda: engine.load(run_id).node("wait_gate").status == "running", what="the gated node to run"
    )
    run = engine.pause(run_id)
    assert run.status == "paused"
    assert run.paused
    GATES.setdefault(str(run_id), threading.Event()).set()
    # The running node finishes; its successor is ready but held: the claim moves it aside.
    wait_until(
        lambda: queue_rows(engine.store, run_id) == {"after_gate": "paused"}, what="the successor held"
    )
    run = engine.load(run_id)
    assert run.node("wait_gate").status == "succeeded"
    assert run.node("after_gate").status == "ready"
    assert run.status == "paused"
    assert calls(engine.store, run_id) == []
    run = engine.resume(run_id)
    assert run.status == "running"
    run = wait_until(lambda: ended(engine, run_id), what="the resumed run to end")
    assert run.status == "succeeded"
    assert calls(engine.store, run_id) == [("after_gate", 1)]
    assert types(engine.store, run_id).count(ev.RUN_PAUSED) == 1
    assert types(engine.store, run_id).count(ev.RUN_RESUMED) == 1


def test_pause_with_interrupt_hands_the_running_node_back_and_resume_runs_it_again(
    engine: Engine, workers: Workers
) -> None:
    workers.start()
    run_id = engine.start("gated").run_id
    wait_until(
        lambda: engine.load(run_id).node("wait_gate").status == "running", what="the gated node to run"
    )
    engine.pause(run_id, interrupt_running=True)
    # The node stops at its next progress write and goes back, held while the run is paused.
    wait_until(
        lambda: queue_rows(engine.store, run_id) == {"wait_gate": "paused"}, what="the node handed back"
    )
    run = engine.load(run_id)
    node = run.node("wait_gate")
    assert (node.status, node.crashes, node.failures) == ("ready", 0, 0)
    released = [e for e in engine.store.read_stream(ev.run_stream(run_id)) if e.type == ev.NODE_RELEASED]
    assert [e.data["reason"] for e in released] == ["paused"]
    engine.resume(run_id)
    wait_until(lambda: engine.load(run_id).node("wait_gate").attempt == 2, what="the node claimed again")
    GATES.setdefault(str(run_id), threading.Event()).set()
    run = wait_until(lambda: ended(engine, run_id), what="the resumed run to end")
    assert run.status == "succeeded"
    assert calls(engine.store, run_id) == [("after_gate", 1)]


def test_a_paused_run_is_claimed_by_no_one_and_resume_keeps_its_place(engine: Engine) -> None:
    first = engine.start("linear").run_id
    second = engine.start("linear").run_id
    engine.pause(first)
    assert queue_rows(engine.store, first) == {"first": "paused"}
    claims = claim_all(engine)
    assert [c.run_id for c in claims] == [second]
    assert claim_all(engine) == []
    engine.resume(first)
    assert queue_rows(engine.store, first) == {"first": "ready"}
    assert [c.run_id for c in claim_all(engine)] == [first]


def test_the_claim_moves_aside_a_ready_row_of_a_paused_run_it_finds(engine: Engine) -> None:
    """A row that became ready while its run was paused (a node's end does not look at pauses) is moved
    aside by the first claim that picks it, and handed to no one."""
    run_id = engine.start("linear").run_id
    engine.pause(run_id)
    with engine.store.pool.connection() as conn:
        conn.execute("UPDATE ledgerflow.workflow_queue SET status = 'ready' WHERE run_id = %s", (run_id,))
    assert claim_all(engine) == []
    assert queue_rows(engine.store, run_id) == {"first": "paused"}


def test_pausing_twice_at_once_records_one_pause(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    barrier = threading.Barrier(4)
    answers: list[str] = []

    def pause() -> None:
        barrier.wait()
        answers.append(engine.pause(run_id).status)

    threads = [threading.Thread(target=pause) for _ in range(4)]
    for t in threads:
        t.start()
    joined(*threads)
    assert answers == ["paused"] * 4
    assert types(engine.store, run_id).count(ev.RUN_PAUSED) == 1
    # Resuming twice at once, too: one resume.
    threads = [threading.Thread(target=lambda: engine.resume(run_id)) for _ in range(3)]
    for t in threads:
        t.start()
    joined(*threads)
    assert types(engine.store, run_id).count(ev.RUN_RESUMED) == 1
    assert engine.resume(run_id).status == "running"  # not paused: nothing to do, and no event
    assert types(engine.store, run_id).count(ev.RUN_RESUMED) == 1


def test_pause_and_resume_refuse_ended_runs_and_other_tenants(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    with pytest.raises(NotFoundError):
        engine.pause(run_id, tenant="acme")
    engine.pause(run_id)
    with pytest.raises(NotFoundError):
        engine.resume(run_id, tenant="acme")
    before = types(engine.store, run_id)
    engine.cancel(run_id)  # a cancellation ends the pause, and the run
    assert queue_rows(engine.store, run_id) == {}
    with pytest.raises(RunStateError, match="already cancelled"):
        engine.pause(run_id)
    with pytest.raises(RunStateError, match="already cancelled"):
        engine.resume(run_id)
    assert types(engine.store, run_id)[: len(before)] == before
    with engine.store.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM ledgerflow.workflow_paused_runs").fetchone() == (0,)


def test_a_crashed_node_of_a_paused_run_waits_for_the_resume_and_resumes_from_its_checkpoints(
    engine: Engine, workers: Workers
) -> None:
    run_id = engine.start("resumable").run_id
    CRASH_AFTER[str(run_id)] = 4
    workers.start()
    # Paused while its node runs; the node dies after item 4 and its lease lapses (a second later): the
    # recovery takes it back, and no one starts it while the run is paused.
    wait_until(lambda: engine.load(run_id).node("items").status == "running", what="the node to run")
    engine.pause(run_id)
    wait_until(lambda: queue_rows(engine.store, run_id) == {"items": "paused"}, what="the lapsed node held")
    assert engine.load(run_id).node("items").crashes == 1
    engine.resume(run_id)
    run = wait_until(lambda: ended(engine, run_id), what="the run to end")
    assert run.status == "succeeded"
    done = [c for c, _ in calls(engine.store, run_id)]
    assert done.count("step:setup") == 1
    assert done.count("item:4") == 1
    assert done.count("item:10") == 1


def test_the_tables_show_the_pause_and_equal_their_rebuild(engine: Engine) -> None:
    run_id = engine.start("linear").run_id
    worker = ProjectorWorker(engine.store, [workflow_tables], WorkerSettings(lease_ttl=60))
    try:
        engine.pause(run_id)
        worker.run_until_caught_up()
        with engine.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT status FROM ledgerflow.workflow_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        assert row == ("paused",)
        assert verify(engine.store, workflow_tables).equal
        engine.resume(run_id)
        worker.run_until_caught_up()
        with engine.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT status FROM ledgerflow.workflow_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        assert row == ("running",)
        assert verify(engine.store, workflow_tables).equal
    finally:
        worker.release_all()

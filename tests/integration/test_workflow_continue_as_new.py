"""`ctx.continue_as_new`: the run's end and its successor's start commit together, linked both ways; a
run cancelled meanwhile starts none; input the engine refuses is a typed error that writes nothing."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner

from eventstore import EventStore
from ops.cli.commands import cli
from projector import verify
from tests.flows import GATES, registry
from tests.run_tables import project_runs
from tests.waiting import wait_until
from workflows import (
    Engine,
    RunFilter,
    WorkerSettings,
    WorkflowWorker,
    release_of,
    release_run,
    search_runs,
    workflow_tables,
)
from workflows import events as ev
from workflows.run_starts import run_id_for
from workflows.run_state import RunState
from workflows.testing import running_worker, wait_for_run


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    with running_worker(
        engine,
        registry,
        WorkerSettings(concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2),
        name="test-worker",
    ) as w:
        yield w


def successor_of(run_id: uuid.UUID, tenant: str = "default") -> uuid.UUID:
    return run_id_for(tenant, f"continue:{run_id}")


def chain(engine: Engine, first: uuid.UUID) -> list[RunState]:
    """The runs of a continue_as_new chain from `first`, each once it has ended."""
    runs = [wait_for_run(engine, first)]
    while runs[-1].continued_as is not None:
        runs.append(wait_for_run(engine, uuid.UUID(runs[-1].continued_as)))
        assert len(runs) < 20, "the chain does not end"
    return runs


def test_a_chain_of_three_continuations_is_linked_both_ways(engine: Engine, worker: WorkflowWorker) -> None:
    started = engine.start("countdown", input={"n": 3}, tags={"team": "a"})
    runs = chain(engine, started.run_id)
    assert [r.status for r in runs] == ["continued", "continued", "continued", "succeeded"]
    assert [r.input["n"] for r in runs] == [3, 2, 1, 0]
    assert runs[0].continued_from is None
    assert runs[-1].continued_as is None
    for before, after in itertools.pairwise(runs):
        assert before.continued_as == str(after.run_id)
        assert after.continued_from == str(before.run_id)
        assert after.run_id == successor_of(before.run_id)
        assert after.tags == {"team": "a"}
        assert after.workflow == "countdown"
        # The continued run's node succeeded; the nodes after it never ran.
        assert before.node("count").status == "succeeded"
        assert before.node("after_count").status == "pending"
    assert runs[-1].node("after_count").output == "after"
    # The tables follow the fold, and a search by status finds the continued runs.
    project_runs(engine.store)
    found = search_runs(engine.store, tenant="default", filter=RunFilter(statuses=("continued",)))
    assert sorted(r["run_id"] for r in found.runs) == sorted(r.run_id for r in runs[:3])
    assert verify(engine.store, workflow_tables).equal


def test_retention_releases_a_continued_run_as_an_ended_one(engine: Engine, worker: WorkflowWorker) -> None:
    first = engine.start("countdown", input={"n": 1}).run_id
    run = wait_for_run(engine, first)
    assert run.status == "continued"
    assert run.finished_at is not None
    later = run.finished_at + timedelta(seconds=2)
    release_run(engine, first, default=timedelta(seconds=1), now=later)
    assert release_of(engine.store, first) is not None
    successor = wait_for_run(engine, uuid.UUID(run.continued_as or ""))
    assert successor.continued_from == str(first)  # the successor's link is its own, left as it was


def test_a_run_cancelled_meanwhile_starts_no_successor(engine: Engine, worker: WorkflowWorker) -> None:
    started = engine.start("countdown", input={"n": 1, "gate": True})
    gate = GATES.setdefault(str(started.run_id), threading.Event())
    wait_until(
        lambda: engine.load(started.run_id).node("count").status == "running",
        timeout=30,
        what="the node to run",
    )
    engine.cancel(started.run_id)
    gate.set()  # the node now calls continue_as_new on a run being cancelled
    run = wait_for_run(engine, started.run_id)
    assert run.status == "cancelled"
    assert run.continued_as is None
    assert engine.store.read_stream(ev.run_stream(successor_of(started.run_id))) == []


@pytest.mark.parametrize(("bad", "error"), [("large", "PayloadTooLargeError"), ("json", "InvalidInputError")])
def test_refused_input_is_a_typed_error_and_writes_nothing(
    engine: Engine, worker: WorkflowWorker, bad: str, error: str
) -> None:
    started = engine.start("countdown", input={"n": 1, "bad": bad})
    run = wait_for_run(engine, started.run_id)
    assert run.status == "succeeded"
    assert run.node("count").output == error
    assert run.continued_as is None
    assert engine.store.read_stream(ev.run_stream(successor_of(started.run_id))) == []
    assert not any(
        e.type == ev.RUN_CONTINUED_AS_NEW for e in engine.store.read_stream(ev.run_stream(run.run_id))
    )


def test_an_async_node_continues_as_new(engine: Engine, worker: WorkflowWorker) -> None:
    runs = chain(engine, engine.start("async_countdown", input={"n": 2}).run_id)
    assert [r.status for r in runs] == ["continued", "continued", "succeeded"]
    assert runs[-1].node("async_count").output == {"done": 0}
    assert runs[-1].continued_from == str(runs[1].run_id)


def test_workflows_show_names_both_links(engine: Engine, worker: WorkflowWorker) -> None:
    runs = chain(engine, engine.start("countdown", input={"n": 1}).run_id)
    env = {"LEDGERFLOW_DATABASE_URL": engine.store.url, "LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
    runner = CliRunner()
    first = runner.invoke(cli, ["workflows", "show", str(runs[0].run_id)], env=env)
    assert first.exit_code == 0, first.output
    assert f"continued_as: {runs[1].run_id}" in first.output
    second = runner.invoke(cli, ["workflows", "show", str(runs[1].run_id), "--json"], env=env)
    assert second.exit_code == 0, second.output
    assert f'"continued_from": "{runs[0].run_id}"' in second.output
    waited = runner.invoke(cli, ["workflows", "wait", str(runs[0].run_id)], env=env)
    assert waited.exit_code == 3, waited.output  # it ended by handing over: not the chain's success
    assert f"continued_as: {runs[1].run_id}" in waited.output


def test_wait_follow_waits_for_the_last_run_of_the_chain_and_exits_as_it_ended(
    engine: Engine, worker: WorkflowWorker
) -> None:
    env = {"LEDGERFLOW_DATABASE_URL": engine.store.url, "LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
    runner = CliRunner()
    # A chain that ends well: the last run succeeded (exit 0), named with its predecessor.
    runs = chain(engine, engine.start("countdown", input={"n": 2}).run_id)
    waited = runner.invoke(cli, ["workflows", "wait", str(runs[0].run_id), "--follow"], env=env)
    assert waited.exit_code == 0, waited.output
    assert f"run {runs[-1].run_id} (countdown) succeeded" in waited.output
    assert f"continued_from: {runs[-2].run_id}" in waited.output
    assert wait_for_run(engine, runs[0].run_id, follow=True).run_id == runs[-1].run_id

    # A chain whose last run was cancelled: exit 1, whichever run of the chain is named.
    first = engine.start("countdown", input={"n": 1, "gate": True}).run_id
    second = successor_of(first)
    GATES.setdefault(str(first), threading.Event()).set()
    gate = GATES.setdefault(str(second), threading.Event())
    wait_until(
        lambda: (
            engine.load(second).node("count").status == "running"
            if engine.store.read_stream(ev.run_stream(second), limit=1)
            else False
        ),
        timeout=30,
        what="the successor's node to run",
    )
    engine.terminate(second)
    gate.set()
    for named in (first, second):
        waited = runner.invoke(cli, ["workflows", "wait", str(named), "--follow", "--timeout", "30"], env=env)
        assert waited.exit_code == 1, waited.output
        assert f"run {second} (countdown) cancelled" in waited.output
    # Without --follow, the first run's own end: it continued.
    waited = runner.invoke(cli, ["workflows", "wait", str(first)], env=env)
    assert waited.exit_code == 3, waited.output


def test_two_nodes_continuing_at_once_start_one_successor(engine: Engine, worker: WorkflowWorker) -> None:
    runs = chain(engine, engine.start("twin_countdown", input={"n": 3}).run_id)
    assert [r.status for r in runs] == ["continued", "continued", "continued", "succeeded"]
    for run in runs[:3]:
        history = engine.store.read_stream(ev.run_stream(run.run_id), limit=10_000)
        assert sum(e.type == ev.RUN_CONTINUED_AS_NEW for e in history) == 1
        with engine.store.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM ledgerflow.events WHERE event_type = 'wf.RunStarted' "
                "AND data ->> 'continued_from' = %s",
                (str(run.run_id),),
            ).fetchone()
        assert row == (1,)

"""`ledgerflow workflows wait` on a run still going, its stream growing while the command waits (it reads
only the events after those it has): it answers when the run ends, not before, with the run's end."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from eventstore import EventStore
from ops.cli.commands import cli
from tests.flows import GATES, registry
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker
from workflows.testing import running_worker


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    with running_worker(
        engine, registry, WorkerSettings(poll_interval=0.05, shutdown_grace=2), name="wait-worker"
    ) as w:
        yield w


def test_wait_answers_when_a_running_run_ends(engine: Engine, worker: WorkflowWorker) -> None:
    run_id = engine.start("gated").run_id
    gate = GATES.setdefault(str(run_id), threading.Event())
    wait_until(lambda: engine.load(run_id).node("wait_gate").status == "running", timeout=30, what="the gate")
    env = {"LEDGERFLOW_DATABASE_URL": engine.store.url, "LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
    answers: list[Result] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            CliRunner().invoke(cli, ["workflows", "wait", str(run_id), "--timeout", "60"], env=env)
        )
    )
    waiting.start()
    # The node reports progress while it waits at the gate: the stream grows under the waiting command.
    grown = engine.load(run_id).version
    wait_until(lambda: engine.load(run_id).version >= grown + 3, timeout=30, what="progress events")
    assert not answers, "the command answered before the run ended"
    assert waiting.is_alive()
    gate.set()
    waiting.join(60)
    assert answers, "the command did not answer once the run ended"
    assert answers[0].exit_code == 0, answers[0].output
    assert f"run {run_id} (gated) succeeded" in answers[0].output

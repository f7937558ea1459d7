"""`ledgerflow workflows signal` and what `show` says of a waiting node, against a fresh database and a
workflow worker beside it: the CLI's commands run in this process (`invoke_cli`), but for the sends the
drill kills, which are real processes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from eventstore import EventStore
from ops.cli.run_views import waiting_note
from tests.acceptance.cli_runs import cli_env, invoke_cli, run_cli
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, NodeState, NodeStatus, WorkerSettings, WorkflowWorker
from workflows.testing import running_worker


def _env(database_url: str) -> dict[str, str]:
    return cli_env(database_url, LEDGERFLOW_WORKFLOWS="tests.flows:registry")


def lf(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return invoke_cli(database_url, *args, LEDGERFLOW_WORKFLOWS="tests.flows:registry")


def lf_process(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(database_url, *args, LEDGERFLOW_WORKFLOWS="tests.flows:registry")


@pytest.fixture
def worker(store: EventStore) -> Iterator[WorkflowWorker]:
    with running_worker(
        Engine(store, registry),
        registry,
        WorkerSettings(poll_interval=0.05, shutdown_grace=1),
        name="cli-test",
    ) as w:
        yield w


def test_signal_a_waiting_run_from_the_command_line(
    database_url: str, store: EventStore, worker: WorkflowWorker
) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("approval").run_id
    wait_until(
        lambda: engine.load(run_id).nodes["review"].status == NodeStatus.WAITING,
        what="the review node to wait",
    )

    shown = lf(database_url, "workflows", "show", str(run_id))
    assert shown.returncode == 0, shown.stderr
    review = next(line for line in shown.stdout.splitlines() if "review" in line)
    assert "waiting for signal approve" in review
    as_json = json.loads(lf(database_url, "workflows", "show", str(run_id), "--json").stdout)
    assert as_json["nodes"]["review"]["status"] == "waiting"
    assert as_json["nodes"]["review"]["waiting_for"] == "approve"
    assert as_json["nodes"]["review"]["wake_at"] is None

    # A signal no node waits for is kept in the run; its repeat with the same key is recorded once.
    note = ("workflows", "signal", str(run_id), "note", "--data", '{"text": "hi"}', "--idempotency-key", "k1")
    first = lf(database_url, *note)
    assert first.returncode == 0, first.stderr
    assert f"signal note sent to run {run_id}" in first.stdout
    assert "duplicate" not in first.stdout
    again = json.loads(lf(database_url, *note, "--json").stdout)
    assert again == {"run_id": str(run_id), "name": "note", "position": again["position"], "duplicate": True}
    assert f"at position {again['position']}" in first.stdout, "the repeat answers with the first send"

    approve = ("workflows", "signal", str(run_id), "approve", "--data", '{"approved": true}')
    assert lf(database_url, *approve).returncode == 0
    wait_until(lambda: not engine.load(run_id).active, what="the run to end")
    run = engine.load(run_id)
    assert run.nodes["publish"].output == {"published": True, "decision": {"approved": True}}
    assert [s.name for s in run.signals] == ["note", "approve"]

    ended = lf(database_url, *approve)
    assert ended.returncode == 1
    assert "run_state_conflict" in ended.stderr
    assert "has ended" in ended.stderr
    assert "Traceback" not in ended.stderr


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (("approve", "--data", "{not json"), 2, "--data takes JSON"),
        (("not a name", "--data", "{}"), 1, "invalid signal name"),
    ],
)
def test_bad_signals_are_explained_and_write_nothing(
    database_url: str, store: EventStore, args: tuple[str, ...], status: int, said: str
) -> None:
    run_id = Engine(store, registry).start("approval").run_id
    refused = lf(database_url, "workflows", "signal", str(run_id), *args)
    assert refused.returncode == status
    assert said in refused.stderr
    assert "Traceback" not in refused.stderr
    assert Engine(store, registry).load(run_id).signals == []


@pytest.mark.drill
def test_a_signal_killed_at_any_moment_and_sent_again_is_recorded_once(
    database_url: str, store: EventStore
) -> None:
    engine = Engine(store, registry)
    rng = random.Random(12)
    began = time.monotonic()
    assert (
        lf_process(
            database_url, "workflows", "signal", str(engine.start("approval").run_id), "warm-up"
        ).returncode
        == 0
    )
    whole = time.monotonic() - began  # how long a signal takes here, start-up included
    answers = []
    for i in range(4):
        run_id = engine.start("approval").run_id
        send = (
            "workflows",
            "signal",
            str(run_id),
            "approve",
            "--data",
            json.dumps({"n": i}),
            "--idempotency-key",
            "k",
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *send],
            env=_env(database_url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Not a synchronisation: the arbitrary moment of the kill, anywhere in the command's life.
        time.sleep(rng.uniform(0.25, 1.0) * whole)
        process.kill()
        process.wait(timeout=30)
        again = lf(database_url, *send)
        assert again.returncode == 0, again.stderr
        answers.append("duplicate" in again.stdout)
        run = engine.load(run_id)
        payloads = [engine.signal_payload(run, n) for n in range(len(run.signals))]
        assert payloads == [{"n": i}], "recorded exactly once"
    print(f"retries that found the killed send recorded: {sum(answers)} of {len(answers)}")


def test_a_waiting_node_says_what_for_and_until_when() -> None:
    due = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    timer = NodeState("nap", status=NodeStatus.WAITING, wake_at=due)
    assert waiting_note(timer) == "sleeping until 2030-01-02T03:04:05+00:00"
    bounded = NodeState("review", status=NodeStatus.WAITING, waiting_for="approve", wake_at=due)
    assert waiting_note(bounded) == "waiting for signal approve until 2030-01-02T03:04:05+00:00"
    assert waiting_note(NodeState("review", status=NodeStatus.WAITING, waiting_for="approve")) == (
        "waiting for signal approve"
    )
    assert waiting_note(NodeState("done", status=NodeStatus.SUCCEEDED)) == ""

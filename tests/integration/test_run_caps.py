"""Caps on what one run may hold, in Python: a signal or an input over its cap raises
PayloadTooLargeError, one signal too many RunSignalLimitError, and nothing is written; a node whose output
or step result is over LEDGERFLOW_MAX_OUTPUT_BYTES fails with that error instead of recording it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from eventstore import EventStore
from tests.waiting import wait_until
from workflows import (
    Engine,
    NodeContext,
    PayloadTooLargeError,
    RunCaps,
    RunSignalLimitError,
    WorkerSettings,
    Workflow,
    WorkflowRegistry,
    WorkflowWorker,
)
from workflows import events as ev
from workflows.run_state import json_bytes
from workflows.testing import running_worker

registry = WorkflowRegistry()
fat = Workflow("fat")


@fat.node()
def produce(ctx: NodeContext) -> Any:
    size = ctx.input["size"]
    if ctx.input.get("in_step"):
        ctx.step("big", lambda: "s" * size)
        return None
    return "o" * size


waits = Workflow("waits")


@waits.node()
def wait(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("go")


many = Workflow("many")


@many.node()
def record(ctx: NodeContext) -> Any:
    for i in range(ctx.input["steps"]):
        ctx.step(f"s{i}", lambda: "s" * 98)  # 100 bytes of JSON each
    return None


registry.register(fat)
registry.register(waits)
registry.register(many)
CAPS = RunCaps(
    max_signals_per_run=2,
    max_signal_bytes=100,
    max_input_bytes=200,
    max_output_bytes=300,
    max_run_state_bytes=1000,
)


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry, CAPS)


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    settings = WorkerSettings(
        concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2
    )
    with running_worker(engine, registry, settings, name="caps-worker") as w:
        yield w


def stream_length(engine: Engine, run_id: uuid.UUID) -> int:
    return len(engine.store.read_stream(ev.run_stream(run_id)))


def test_signals_and_inputs_over_their_caps_are_refused_and_write_nothing(engine: Engine) -> None:
    with pytest.raises(PayloadTooLargeError, match="LEDGERFLOW_MAX_INPUT_BYTES") as too_big:
        engine.start("waits", input="i" * 200)
    assert too_big.value.details() == {"size": 202, "limit": 200, "setting": "LEDGERFLOW_MAX_INPUT_BYTES"}
    run_id = engine.start("waits", input="i" * 198).run_id
    length = stream_length(engine, run_id)
    with pytest.raises(PayloadTooLargeError, match="LEDGERFLOW_MAX_SIGNAL_BYTES"):
        engine.signal(run_id, "go", {"pad": "p" * 100})
    assert stream_length(engine, run_id) == length
    engine.signal(run_id, "go", 1)
    engine.signal(run_id, "go", 2, idempotency_key="two")
    with pytest.raises(RunSignalLimitError, match="LEDGERFLOW_MAX_SIGNALS_PER_RUN"):
        engine.signal(run_id, "go", 3)
    assert stream_length(engine, run_id) == length + 2
    assert engine.signal(run_id, "go", 2, idempotency_key="two").duplicate
    with pytest.raises(PayloadTooLargeError):
        engine.refresh(run_id, input=["r" * 300])


@pytest.mark.parametrize("in_step", [False, True])
def test_an_output_over_its_cap_fails_the_node(engine: Engine, worker: WorkflowWorker, in_step: bool) -> None:
    ok = engine.start("fat", input={"size": 298, "in_step": in_step}).run_id  # 300 bytes of JSON: within
    big = engine.start("fat", input={"size": 299, "in_step": in_step}).run_id
    for run_id, status in ((ok, "succeeded"), (big, "failed")):
        run = wait_until(lambda r=run_id: (s := engine.load(r)).active is False and s, what="the run to end")
        assert run.status == status, run.error
    run = engine.load(big)
    assert run.error is not None
    assert "LEDGERFLOW_MAX_OUTPUT_BYTES" in run.error
    assert not any(e.type == ev.NODE_SUCCEEDED for e in engine.store.read_stream(ev.run_stream(big)))
    assert run.node("produce").steps == {}


def test_a_step_that_would_take_the_runs_state_over_its_cap_fails_the_node(
    engine: Engine, worker: WorkflowWorker
) -> None:
    ok = engine.start("many", input={"steps": 10}).run_id  # 1,000 bytes held: within
    big = engine.start("many", input={"steps": 11}).run_id
    for run_id, status in ((ok, "succeeded"), (big, "failed")):
        run = wait_until(lambda r=run_id: (s := engine.load(r)).active is False and s, what="the run to end")
        assert run.status == status, run.error
    run = engine.load(big)
    assert run.error is not None
    assert "LEDGERFLOW_MAX_RUN_STATE_BYTES" in run.error
    assert "result of step 's10'" in run.error
    # The step that was refused was not recorded; the state holds what the ten before it hold.
    assert sorted(run.node("record").steps) == sorted(f"s{i}" for i in range(10))
    assert run.held_bytes == 1000 == sum(json_bytes(v) for v in run.node("record").steps.values())


def test_a_waiting_node_takes_the_signals_payload_by_reference(
    engine: Engine, worker: WorkflowWorker
) -> None:
    run_id = engine.start("waits").run_id
    engine.signal(run_id, "go", {"approved": True, "n": 1.5})
    run = wait_until(lambda: (s := engine.load(run_id)).active is False and s, what="the run to end")
    assert run.node("wait").output == {"approved": True, "n": 1.5}
    recorded = [
        e.stream_version
        for e in engine.store.read_stream(ev.run_stream(run_id))
        if e.type == ev.SIGNAL_RECEIVED
    ]
    assert [(s.name, s.version) for s in run.signals] == [("go", recorded[0])]

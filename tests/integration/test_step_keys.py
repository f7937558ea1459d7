"""A step key names one step of a node's body: asking for the same key twice in one run of the body is a
typed error that fails the node, instead of silently handing the second call the first one's result."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from eventstore import EventStore
from workflows import (
    Engine,
    NodeContext,
    RepeatedStepKeyError,
    RetryPolicy,
    Workflow,
    WorkflowRegistry,
    WorkflowWorker,
)
from workflows.testing import running_worker, wait_for_run

registry = WorkflowRegistry()
summaries = Workflow("summaries")
calls: list[str] = []


def _summary(doc: str) -> str:
    calls.append(doc)
    return f"summary of {doc}"


@summaries.node(retry=RetryPolicy(max_attempts=1))
def summarise(ctx: NodeContext) -> Any:
    out = []
    for doc in ctx.input["docs"]:
        key = "summary" if ctx.input["one_key"] else f"summary:{doc}"
        out.append(ctx.step(key, functools.partial(_summary, doc)))
    return out


registry.register(summaries)


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    with running_worker(engine, registry, name="step-keys") as w:
        yield w


def _ended(engine: Engine, run_id: Any) -> Any:
    return wait_for_run(engine, run_id)


def test_a_repeated_step_key_fails_the_node_and_the_second_step_never_runs(
    engine: Engine, worker: WorkflowWorker
) -> None:
    calls.clear()
    run = _ended(engine, engine.start("summaries", input={"docs": ["a", "b", "c"], "one_key": True}).run_id)
    assert run.status == "failed"
    assert run.error is not None
    assert "asked for step 'summary' twice" in run.error
    assert calls == ["a"]
    assert run.node("summarise").steps == {"summary": "summary of a"}


def test_distinct_keys_each_run_once(engine: Engine, worker: WorkflowWorker) -> None:
    calls.clear()
    run = _ended(engine, engine.start("summaries", input={"docs": ["a", "b"], "one_key": False}).run_id)
    assert run.status == "succeeded", run.error
    assert run.node("summarise").output == ["summary of a", "summary of b"]
    assert calls == ["a", "b"]


def test_the_error_names_the_node_and_key() -> None:
    error = RepeatedStepKeyError("summarise", "summary")
    assert error.details() == {"node": "summarise", "key": "summary"}
    assert error.code == "repeated_step_key"

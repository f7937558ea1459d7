"""Limits as declared in code: checked when declared, carried by the registry and its loading."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

from workflows import NodeContext, Workflow, WorkflowRegistry, load_workflows
from workflows.definition_checks import DefinitionError
from workflows.workflow_registry import Limit


def body(ctx: NodeContext) -> int:
    return 1


@pytest.mark.parametrize(
    ("concurrency", "per_minute"),
    [(None, None), (0, None), (None, 0), (-1, 5), (2.5, None), (True, None), ("4", None)],
)
def test_a_limit_bounds_something_with_whole_numbers(concurrency: object, per_minute: object) -> None:
    with pytest.raises(DefinitionError):
        Limit("llm", concurrency, per_minute)  # type: ignore[arg-type]


def test_limit_names_are_checked_where_they_are_named() -> None:
    with pytest.raises(DefinitionError, match="limit name"):
        WorkflowRegistry().limit("LLM!", concurrency=1)
    wf = Workflow("w")
    with pytest.raises(DefinitionError, match="not the string"):
        wf.node(limits="llm")(body)
    with pytest.raises(DefinitionError, match="more than once"):
        wf.node(limits=["llm", "llm"])(body)


def test_a_limit_is_declared_once_or_the_same_again() -> None:
    registry = WorkflowRegistry()
    assert registry.limit("llm", concurrency=4) == registry.limit("llm", concurrency=4)
    with pytest.raises(DefinitionError, match="already declared"):
        registry.limit("llm", concurrency=5)
    assert dict(registry.limits) == {"llm": Limit("llm", 4)}


def test_the_function_is_returned_unchanged_and_the_spec_checks_its_slot_first() -> None:
    wf = Workflow("w")
    assert wf.node(limits=["llm"])(body) is body
    spec = wf.nodes["body"]
    assert spec.limits == ("llm",)
    assert spec.fn is not body
    assert spec.fn.__wrapped__ is body  # type: ignore[attr-defined]

    async def later(ctx: NodeContext) -> int:
        return 1

    wf.node(limits=["llm"])(later)
    assert inspect.iscoroutinefunction(wf.nodes["later"].fn)
    wf.node(name="plain")(body)
    assert wf.nodes["plain"].fn is body  # no limits: the function itself


def test_loading_a_registry_carries_its_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = WorkflowRegistry()
    registry.limit("llm", concurrency=2, per_minute=10)
    wf = Workflow("w")
    wf.node(limits=["llm"])(body)
    registry.register(wf)
    module = types.ModuleType("limit_flows_for_loading")
    module.registry = registry  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "limit_flows_for_loading", module)
    loaded = load_workflows(["limit_flows_for_loading:registry"])
    assert dict(loaded.limits) == {"llm": Limit("llm", 2, 10)}

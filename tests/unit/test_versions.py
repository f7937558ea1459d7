"""Several versions of a workflow in one registry: which one new runs start with, which one a run needs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore.errors import NotFoundError
from workflows.definition import Workflow
from workflows.definition_checks import DefinitionError
from workflows.loading import load_workflows
from workflows.workflow_registry import WorkflowRegistry, version_order


def flow(name: str = "pipeline", version: Any = "1", nodes: tuple[str, ...] = ("a",)) -> Workflow:
    wf = Workflow(name, version=version)
    for node in nodes:
        wf.node(name=node)(lambda ctx: None)
    return wf


def test_new_runs_get_the_newest_version_and_runs_the_one_they_started_with() -> None:
    registry = WorkflowRegistry()
    v1, v10, v2 = flow(version="1"), flow(version="10", nodes=("a", "b")), flow(version="2")
    for wf in (v1, v10, v2):
        registry.register(wf)
    assert registry.get("pipeline") is v10  # by value, not as text: "10" is newer than "2"
    assert registry.get("pipeline", "1") is v1
    assert registry.get("pipeline", "2") is v2
    assert registry.versions("pipeline") == ["1", "2", "10"]
    assert registry.names() == ["pipeline"]
    assert registry.name_versions() == [("pipeline", "1"), ("pipeline", "2"), ("pipeline", "10")]
    assert registry.definitions() == [v1, v2, v10]


def test_a_version_this_process_lacks_is_a_clear_not_found() -> None:
    registry = WorkflowRegistry()
    registry.register(flow(version="2"))
    with pytest.raises(
        NotFoundError, match=r"workflow 'pipeline' has no version '1' here; registered versions: '2'"
    ):
        registry.get("pipeline", "1")
    assert registry.versions("other") == []


def test_one_version_is_one_definition() -> None:
    registry = WorkflowRegistry()
    first = registry.register(flow(version="3"))
    assert registry.register(first) is first  # the same object again is fine
    with pytest.raises(DefinitionError, match="give the changed definition a new version"):
        registry.register(flow(version="3", nodes=("a", "b")))
    assert registry.get("pipeline", "3") is first


@pytest.mark.parametrize("bad", ["", " 1", "1 ", "v/2", "é", "x" * 64, None, 1.5, True, -1])
def test_a_malformed_version_is_refused(bad: Any) -> None:
    with pytest.raises(DefinitionError, match="invalid version"):
        WorkflowRegistry().register(flow(version=bad))


def test_a_version_written_as_a_number_is_its_text() -> None:
    registry = WorkflowRegistry()
    wf = registry.register(flow(version=7))
    assert wf.version == "7"
    assert registry.get("pipeline", "7") is wf


def test_loading_a_registry_carries_every_version() -> None:
    import tests.unit.test_versions as here

    here.loaded = WorkflowRegistry()  # type: ignore[attr-defined]
    for v in ("1", "2"):
        here.loaded.register(flow(version=v))  # type: ignore[attr-defined]
    registry = load_workflows(["tests.unit.test_versions:loaded"])
    assert registry.versions("pipeline") == ["1", "2"]


versions = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True)


@given(st.lists(versions, min_size=1, max_size=6, unique=True))
def test_the_newest_does_not_depend_on_registration_order(found: list[str]) -> None:
    forwards, backwards = WorkflowRegistry(), WorkflowRegistry()
    for v in found:
        forwards.register(flow(version=v))
    for v in reversed(found):
        backwards.register(flow(version=v))
    assert forwards.get("pipeline").version == backwards.get("pipeline").version
    assert forwards.get("pipeline").version == max(found, key=version_order)
    assert forwards.versions("pipeline") == backwards.versions("pipeline")


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_numbers_are_ordered_by_value(a: int, b: int) -> None:
    assert (version_order(str(a)) < version_order(str(b))) == (a < b)

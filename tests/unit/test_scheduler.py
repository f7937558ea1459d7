"""Scheduling decisions: what may start, how a run stands, what runs again."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_definition import ancestors, dags, spec, workflow
from workflows.definition import Workflow
from workflows.scheduler import NodeStatus, nodes_to_rerun, retry_from_failed, run_outcome, runnable_nodes

S = NodeStatus


@st.composite
def dags_with_statuses(draw: st.DrawFn) -> tuple[Workflow, dict[str, NodeStatus]]:
    wf = draw(dags())
    return wf, {name: draw(st.sampled_from(NodeStatus)) for name in wf.nodes}


def drive(wf: Workflow, statuses: dict[str, NodeStatus], fail: frozenset[str] = frozenset()) -> list[str]:
    """Run every runnable node until none is left; nodes in `fail` fail. Returns the order they ran in."""
    ran: list[str] = []
    while batch := runnable_nodes(wf, statuses):
        assert run_outcome(wf, statuses) == "running"
        for name in batch:
            statuses[name] = S.FAILED if name in fail else S.SUCCEEDED
            ran.append(name)
    return ran


# --- runnable_nodes --------------------------------------------------------------------------------------


@given(dags_with_statuses())
def test_runnable_nodes_are_exactly_the_pending_ones_whose_dependencies_succeeded(
    case: tuple[Workflow, dict[str, NodeStatus]],
) -> None:
    wf, statuses = case
    runnable = runnable_nodes(wf, statuses)
    for name in runnable:
        assert statuses[name] is S.PENDING
        assert all(statuses[dep] is S.SUCCEEDED for dep in wf.nodes[name].depends_on)
    expected = {
        name
        for name, node in wf.nodes.items()
        if statuses[name] is S.PENDING and all(statuses[d] is S.SUCCEEDED for d in node.depends_on)
    }
    assert set(runnable) == expected
    assert runnable == [name for name in wf.topological_order() if name in expected]


def test_a_node_with_no_recorded_status_counts_as_pending() -> None:
    wf = workflow(spec("a"), spec("b", "a"), spec("c"))
    assert runnable_nodes(wf, {}) == ["a", "c"]
    assert runnable_nodes(wf, {"a": S.SUCCEEDED, "gone": S.FAILED}) == ["b", "c"]


@given(dags())
def test_driving_a_run_runs_every_node_once_after_its_dependencies(wf: Workflow) -> None:
    statuses: dict[str, NodeStatus] = {}
    ran = drive(wf, statuses)
    assert sorted(ran) == sorted(wf.nodes)
    for name in wf.nodes:
        assert all(ran.index(dep) < ran.index(name) for dep in wf.nodes[name].depends_on)
    assert run_outcome(wf, statuses) == "succeeded"


# --- run_outcome -----------------------------------------------------------------------------------------

# a fans out to b and c, which fan in to d; e is independent of them all.
DIAMOND = workflow(spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "b", "c"), spec("e"))
DONE = {"a": S.SUCCEEDED, "b": S.SUCCEEDED, "c": S.SUCCEEDED, "d": S.SUCCEEDED, "e": S.SUCCEEDED}


@pytest.mark.parametrize(
    ("changes", "outcome"),
    [
        ({}, "succeeded"),
        ({"d": S.PENDING}, "running"),
        ({"b": S.RUNNING, "d": S.PENDING}, "running"),
        ({"b": S.RETRY_SCHEDULED, "d": S.PENDING}, "running"),
        ({"e": S.READY}, "running"),
        ({"b": S.FAILED, "d": S.PENDING}, "failed"),  # d can never run
        ({"b": S.FAILED, "c": S.RUNNING, "d": S.PENDING}, "running"),  # c is still working
        ({"b": S.FAILED, "d": S.PENDING, "e": S.PENDING}, "running"),  # e can still run
        ({"b": S.PARKED, "d": S.PENDING}, "failed"),
        ({"a": S.FAILED, "b": S.PENDING, "c": S.PENDING, "d": S.PENDING}, "failed"),
        ({"c": S.CANCELLED, "d": S.PENDING}, "cancelled"),
        ({"c": S.CANCELLED, "d": S.PENDING, "e": S.RUNNING}, "running"),
        ({"b": S.FAILED, "c": S.CANCELLED, "d": S.PENDING}, "failed"),
        ({"b": S.SKIPPED, "d": S.PENDING}, "succeeded"),  # d waits behind a skipped node
    ],
)
def test_run_outcome(changes: Mapping[str, NodeStatus], outcome: str) -> None:
    assert run_outcome(DIAMOND, {**DONE, **changes}) == outcome


def test_a_run_with_no_recorded_statuses_is_running() -> None:
    assert run_outcome(DIAMOND, {}) == "running"


@given(dags(), st.data())
def test_a_run_that_stops_on_a_failure_is_failed_until_retried(wf: Workflow, data: st.DataObject) -> None:
    failing = data.draw(st.sampled_from(sorted(wf.nodes)))
    statuses: dict[str, NodeStatus] = {}
    drive(wf, statuses, fail=frozenset({failing}))
    assert run_outcome(wf, statuses) == "failed"
    assert all(name not in statuses for name in wf.descendants(failing))  # never started

    reset = retry_from_failed(wf, statuses)
    assert reset == {failing} | wf.descendants(failing)
    statuses.update(dict.fromkeys(reset, S.PENDING))
    assert sorted(drive(wf, statuses)) == sorted(reset)  # completed nodes are not run again
    assert run_outcome(wf, statuses) == "succeeded"


# --- nodes_to_rerun --------------------------------------------------------------------------------------


def fingerprints(wf: Workflow) -> dict[str, str]:
    return {name: node.fingerprint for name, node in wf.nodes.items()}


@given(dags(), st.data())
def test_a_changed_node_reruns_with_all_its_descendants_and_nothing_upstream(
    wf: Workflow, data: st.DataObject
) -> None:
    changed = data.draw(st.sampled_from(sorted(wf.nodes)))
    old = fingerprints(wf)
    new = {**old, changed: "0" * 64}
    rerun = nodes_to_rerun(wf, old, new, input_changed=False)
    assert rerun == {changed} | wf.descendants(changed)
    assert not rerun & ancestors(wf, changed)
    assert nodes_to_rerun(wf, old, old, input_changed=False) == set()


@given(dags())
def test_new_input_reruns_everything(wf: Workflow) -> None:
    old = fingerprints(wf)
    assert nodes_to_rerun(wf, old, old, input_changed=True) == set(wf.nodes)


def test_rerun_follows_a_new_code_version() -> None:
    before = workflow(spec("fetch"), spec("parse", "fetch"), spec("enrich", "parse"), spec("index", "fetch"))
    after = workflow(
        spec("fetch"),
        spec("parse", "fetch", code_version="2"),
        spec("enrich", "parse"),
        spec("index", "fetch"),
    )
    assert nodes_to_rerun(after, fingerprints(before), fingerprints(after), input_changed=False) == {
        "parse",
        "enrich",
    }


def test_a_node_new_to_the_definition_reruns() -> None:
    before = workflow(spec("fetch"))
    after = workflow(spec("fetch"), spec("summary", "fetch"))
    assert nodes_to_rerun(after, fingerprints(before), fingerprints(after), input_changed=False) == {
        "summary"
    }


# --- retry_from_failed -----------------------------------------------------------------------------------


@given(dags_with_statuses())
def test_retry_from_failed_keeps_succeeded_nodes(case: tuple[Workflow, dict[str, NodeStatus]]) -> None:
    wf, statuses = case
    reset = retry_from_failed(wf, statuses)
    stopped = {n for n, s in statuses.items() if s in {S.FAILED, S.PARKED, S.CANCELLED}}
    downstream = set().union(*(wf.descendants(n) for n in stopped))
    assert stopped <= reset
    assert not any(statuses[name] is S.SUCCEEDED for name in reset)
    assert reset == stopped | {n for n in downstream if statuses[n] is not S.SUCCEEDED}


def test_retry_from_failed_resets_the_failed_branch_only() -> None:
    statuses = {"a": S.SUCCEEDED, "b": S.FAILED, "c": S.SUCCEEDED, "d": S.SKIPPED, "e": S.SUCCEEDED}
    assert retry_from_failed(DIAMOND, statuses) == {"b", "d"}
    assert retry_from_failed(DIAMOND, DONE) == set()

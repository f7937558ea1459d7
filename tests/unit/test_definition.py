"""Workflow definitions: validation messages, graph queries, retry backoff and node fingerprints."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore.errors import InvalidInputError, NotFoundError
from workflows.definition import Workflow
from workflows.definition_checks import DefinitionError
from workflows.node_spec import NodeSpec, RetryPolicy
from workflows.workflow_registry import WorkflowRegistry

ROOT = Path(__file__).resolve().parents[2]


def noop(ctx: Any) -> None:
    return None


def spec(name: str, *deps: str, **options: Any) -> NodeSpec:
    return NodeSpec(name, noop, depends_on=deps, **options)


def workflow(*specs: NodeSpec, name: str = "wf") -> Workflow:
    wf = Workflow(name)
    for s in specs:
        wf.add_node(s)
    return wf


# Random DAGs (to move to tests/strategies.py): node i may depend only on nodes before it, so the graph is
# acyclic by construction; the nodes are then declared in a random order, so dependencies are often
# declared after their dependents and the declaration order is not itself a topological order.
@st.composite
def dags(draw: st.DrawFn, max_nodes: int = 10) -> Workflow:
    count = draw(st.integers(min_value=1, max_value=max_nodes))
    names = [f"n{i}" for i in range(count)]
    deps = [
        draw(st.lists(st.sampled_from(names[:i]), unique=True, max_size=3)) if i else [] for i in range(count)
    ]
    return workflow(*(spec(names[i], *deps[i]) for i in draw(st.permutations(range(count)))))


def ancestors(wf: Workflow, name: str) -> set[str]:
    return {other for other in wf.nodes if name in wf.descendants(other)}


# --- declaring -------------------------------------------------------------------------------------------


def test_the_decorator_declares_nodes_and_returns_the_function() -> None:
    wf = Workflow("extraction", version="1")
    policy = RetryPolicy(max_attempts=5)

    @wf.node(retry=policy, timeout=600, progress_deadline=120, code_version="2", config={"model": "x"})
    def fetch(ctx: Any) -> str:
        return "fetched"

    @wf.node(depends_on=["fetch"], name="parse_pages")
    def parse(ctx: Any) -> None: ...

    wf.add_node(NodeSpec("store", noop, depends_on=("parse_pages",)))

    assert fetch(None) == "fetched"
    assert list(wf.nodes) == ["fetch", "parse_pages", "store"]
    node = wf.nodes["fetch"]
    assert (node.fn, node.retry, node.timeout, node.progress_deadline) == (fetch, policy, 600, 120)
    assert (node.code_version, node.config, node.max_crashes) == ("2", {"model": "x"}, 5)
    assert wf.nodes["parse_pages"].depends_on == ("fetch",)
    assert wf.nodes["store"].retry == RetryPolicy()
    wf.validate()


def test_config_is_copied_so_later_changes_to_the_callers_dict_do_not_leak_in() -> None:
    config: dict[str, Any] = {"models": ["a"], "limits": (1, 2)}
    node = spec("fetch", config=config)
    before = node.fingerprint
    config["models"].append("b")
    assert node.config == {"models": ["a"], "limits": [1, 2]}  # JSON form: what is read back after a crash
    assert node.fingerprint == before


def test_nodes_cannot_be_added_through_the_nodes_mapping() -> None:
    wf = workflow(spec("a"))
    with pytest.raises(TypeError):
        wf.nodes["b"] = spec("b")  # type: ignore[index]


# --- validation: each message names the culprit ----------------------------------------------------------


def test_definition_errors_are_invalid_input() -> None:
    assert issubclass(DefinitionError, InvalidInputError)
    assert issubclass(DefinitionError, ValueError)


def test_a_cycle_is_named_in_flow_order() -> None:
    # d hangs off the cycle without being part of it, and is declared first.
    wf = workflow(spec("d", "a"), spec("a", "c"), spec("b", "a"), spec("c", "b"))
    with pytest.raises(DefinitionError, match=r"cycle: a -> b -> c -> a \(") as caught:
        wf.validate()
    assert "d" not in str(caught.value).split("cycle:")[1].split("(")[0]


def test_a_two_node_cycle() -> None:
    with pytest.raises(DefinitionError, match="cycle: y -> x -> y"):  # starts at the node declared first
        workflow(spec("y", "x"), spec("x", "y")).validate()


def test_an_unknown_dependency_names_the_node_and_the_dependency() -> None:
    with pytest.raises(DefinitionError, match=r"node 'parse' depends on unknown node\(s\) \['fetc'\]"):
        workflow(spec("fetch"), spec("parse", "fetc")).validate()


def test_a_duplicate_node_name() -> None:
    wf = workflow(spec("fetch"))
    with pytest.raises(DefinitionError, match="already has a node named 'fetch'"):
        wf.add_node(spec("fetch"))

    @wf.node(name="parse")
    def first(ctx: Any) -> None: ...

    with pytest.raises(DefinitionError, match="already has a node named 'parse'"):

        @wf.node()
        def parse(ctx: Any) -> None: ...


def test_an_empty_workflow() -> None:
    with pytest.raises(DefinitionError, match="workflow 'empty' has no nodes"):
        Workflow("empty").validate()


BAD_NAMES = ["", "Fetch", "1st", "a-b", "a.b", "a b", "a" * 64, "fetch\n", "caf\u00e9", "_x"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_invalid_workflow_name(name: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(f"invalid workflow name {name!r}")):
        Workflow(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_invalid_node_name(name: str) -> None:
    with pytest.raises(DefinitionError, match=re.escape(f"invalid node name {name!r}")):
        spec(name)


def test_the_longest_valid_name() -> None:
    Workflow("a" * 63).add_node(spec("b" * 63))


def test_a_self_dependency() -> None:
    with pytest.raises(DefinitionError, match="node 'loop' depends on itself"):
        spec("loop", "loop")


def test_depends_on_given_as_a_string() -> None:
    wf = Workflow("wf")
    with pytest.raises(DefinitionError, match=r"node 'parse': depends_on must be a list .* 'fetch'"):

        @wf.node(depends_on="fetch")
        def parse(ctx: Any) -> None: ...


def test_a_repeated_dependency() -> None:
    with pytest.raises(DefinitionError, match="node 'parse' lists a dependency more than once"):
        spec("parse", "fetch", "fetch")


@pytest.mark.parametrize(
    ("config", "culprit"),
    [
        ({"tags": {"a"}}, "config['tags'] is a set"),
        ({"client": object()}, "config['client'] is a object"),
        ({"nested": {"deep": [1, float("nan")]}}, "config['nested']['deep'][1] is nan"),
        ({"limit": float("inf")}, "config['limit'] is inf"),
        ({"by_id": {1: "a"}}, "config['by_id'] has the non-string key 1"),
    ],
)
def test_a_config_that_is_not_plain_json(config: dict[str, Any], culprit: str) -> None:
    with pytest.raises(DefinitionError, match="node 'fetch'") as caught:
        spec("fetch", config=config)
    assert culprit in str(caught.value)


@pytest.mark.parametrize(
    ("options", "culprit"),
    [
        ({"timeout": 0}, "timeout must be a positive"),
        ({"progress_deadline": -1.0}, "progress_deadline must be a positive"),
        ({"max_crashes": -1}, "max_crashes must not be negative"),
    ],
)
def test_nonsensical_limits(options: dict[str, Any], culprit: str) -> None:
    with pytest.raises(DefinitionError, match=f"node 'fetch': {culprit}"):
        spec("fetch", **options)


@pytest.mark.parametrize(
    ("options", "culprit"),
    [
        ({"max_attempts": 0}, "max_attempts must be at least 1"),
        ({"initial_backoff": -1.0}, "initial_backoff must not be negative"),
        ({"initial_backoff": 10.0, "max_backoff": 5.0}, "max_backoff must be at least initial_backoff"),
        ({"multiplier": 0.5}, "multiplier must be at least 1"),
        ({"jitter": 1.5}, "jitter must be between 0 and 1"),
    ],
)
def test_an_invalid_retry_policy(options: dict[str, Any], culprit: str) -> None:
    with pytest.raises(DefinitionError, match=culprit):
        RetryPolicy(**options)


# --- the registry ----------------------------------------------------------------------------------------


def test_register_validates_and_refuses_a_second_workflow_of_the_same_name() -> None:
    registry = WorkflowRegistry()
    with pytest.raises(DefinitionError, match="cycle"):
        registry.register(workflow(spec("a", "b"), spec("b", "a"), name="broken"))
    assert registry.names() == []

    wf = registry.register(workflow(spec("a"), name="extraction"))
    assert registry.register(wf) is wf  # registering the same object again is harmless
    with pytest.raises(DefinitionError, match="different workflow named 'extraction'"):
        registry.register(workflow(spec("a"), name="extraction"))
    registry.register(workflow(spec("a"), name="billing"))
    assert registry.names() == ["billing", "extraction"]
    assert registry.get("extraction") is wf


def test_get_an_unknown_workflow_lists_the_known_ones() -> None:
    registry = WorkflowRegistry()
    with pytest.raises(NotFoundError, match="no workflow named 'x' is registered; known workflows: none"):
        registry.get("x")
    registry.register(workflow(spec("a"), name="extraction"))
    registry.register(workflow(spec("a"), name="billing"))
    with pytest.raises(NotFoundError, match=r"'extractoin'.*known workflows: 'billing', 'extraction'"):
        registry.get("extractoin")


def test_a_registered_workflow_takes_no_more_nodes() -> None:
    wf = WorkflowRegistry().register(workflow(spec("a")))
    with pytest.raises(DefinitionError, match="already registered"):
        wf.add_node(spec("b", "a"))
    assert list(wf.nodes) == ["a"]


# --- graph queries ---------------------------------------------------------------------------------------


@given(dags())
def test_topological_order_puts_every_node_after_its_dependencies(wf: Workflow) -> None:
    order = wf.topological_order()
    assert sorted(order) == sorted(wf.nodes)
    position = {name: i for i, name in enumerate(order)}
    for name, node in wf.nodes.items():
        assert all(position[dep] < position[name] for dep in node.depends_on)
    assert wf.topological_order() == order


def test_topological_ties_go_to_the_node_declared_first() -> None:
    assert workflow(spec("c"), spec("a"), spec("b")).topological_order() == ["c", "a", "b"]
    # fan-out then fan-in: z is declared before its dependency and still comes after it
    wf = workflow(spec("z", "y", "x"), spec("root"), spec("y", "root"), spec("x", "root"))
    assert wf.topological_order() == ["root", "y", "x", "z"]
    assert wf.roots() == ["root"]


@given(dags())
def test_descendants_are_the_transitive_dependents(wf: Workflow) -> None:
    order = wf.topological_order()
    for name in wf.nodes:
        expected: set[str] = set()
        for other in order:  # a node is downstream if any of its dependencies is `name` or downstream
            if any(dep == name or dep in expected for dep in wf.nodes[other].depends_on):
                expected.add(other)
        assert wf.descendants(name) == expected
    assert set(wf.roots()) == {name for name in wf.nodes if not ancestors(wf, name)}


def test_descendants_of_an_unknown_node() -> None:
    with pytest.raises(NotFoundError, match="has no node 'b'"):
        workflow(spec("a")).descendants("b")


# --- retries ---------------------------------------------------------------------------------------------


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_backoff=1.0, max_backoff=60.0, multiplier=2.0, jitter=0.0)
    assert [policy.backoff(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert policy.backoff(100_000) == 60  # no OverflowError long after the cap applies


@given(
    attempt=st.integers(min_value=1, max_value=2_000),
    jitter=st.floats(min_value=0, max_value=1),
    seed=st.integers(),
)
def test_jitter_stays_within_its_band_and_under_the_cap(attempt: int, jitter: float, seed: int) -> None:
    policy = RetryPolicy(initial_backoff=0.5, max_backoff=30.0, multiplier=3.0, jitter=jitter)
    base = min(30.0, 0.5 * 3.0 ** min(attempt - 1, 100))
    wait = policy.backoff(attempt, random.Random(seed))
    assert base * (1 - jitter) - 1e-9 <= wait <= min(30.0, base * (1 + jitter)) + 1e-9
    assert wait == policy.backoff(attempt, random.Random(seed))  # a seeded rng makes it reproducible


def test_jitter_spreads_waits_without_a_given_rng() -> None:
    waits = {RetryPolicy().backoff(3) for _ in range(50)}
    assert len(waits) > 1
    assert all(4 * 0.8 <= w <= 4 * 1.2 for w in waits)


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        RetryPolicy().backoff(0)


class LeaseLost(BaseException):
    """Stands in for the signals user code must not swallow."""


def test_which_failures_are_retryable() -> None:
    default = RetryPolicy()
    assert default.is_retryable(TimeoutError())
    assert not default.is_retryable(LeaseLost())
    policy = RetryPolicy(retry_on=(OSError,), never_retry=(FileNotFoundError,))
    assert policy.is_retryable(ConnectionResetError())
    assert not policy.is_retryable(FileNotFoundError())  # never_retry wins over retry_on
    assert not policy.is_retryable(ValueError())


# --- fingerprints ----------------------------------------------------------------------------------------

# The canonical form the fingerprint hashes, pinned: changing it changes every fingerprint, so refreshing any
# completed run would rerun all of its nodes. If that is intended, update this knowingly.
CANONICAL = (
    '{"code_version":"2","config":{"model":"x","params":{"n":[1,2],"t":0.5}},'
    '"depends_on":["a","b"],"name":"fetch"}'
)
FINGERPRINT_SCRIPT = """
from workflows.node_spec import NodeSpec
print(NodeSpec("fetch", print, depends_on=("b", "a"), code_version="2",
               config={"model": "x", "params": {"t": 0.5, "n": [1, 2]}}).fingerprint)
"""


def test_the_fingerprint_is_the_same_in_every_process() -> None:
    here = NodeSpec(
        "fetch",
        noop,
        depends_on=("a", "b"),
        code_version="2",
        config={"params": {"n": [1, 2], "t": 0.5}, "model": "x"},
    ).fingerprint
    for seed in ("0", "1", "12345"):  # str hashing differs per process unless the seed is pinned
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", FINGERPRINT_SCRIPT],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert out.stdout.strip() == here
    assert here == hashlib.sha256(CANONICAL.encode()).hexdigest()


def test_the_fingerprint_follows_what_the_node_computes() -> None:
    base = spec("fetch", "a", "b", code_version="1", config={"model": "x"})
    same = [
        NodeSpec("fetch", print, depends_on=("b", "a"), code_version="1", config={"model": "x"}),
        spec("fetch", "a", "b", config={"model": "x"}, retry=RetryPolicy(max_attempts=9), timeout=5.0),
        spec("fetch", "a", "b", config=json.loads('{"model": "x"}'), max_crashes=1, progress_deadline=3.0),
    ]
    different = [
        spec("fetch", "a", "b", code_version="2", config={"model": "x"}),
        spec("fetch", "a", "b", config={"model": "y"}),
        spec("fetch", "a", "b", config={"model": "x", "temperature": 0}),
        spec("fetch", "a", config={"model": "x"}),
        spec("fetch2", "a", "b", config={"model": "x"}),
    ]
    assert {s.fingerprint for s in same} == {base.fingerprint}
    assert len({s.fingerprint for s in different} | {base.fingerprint}) == len(different) + 1


def test_the_fingerprint_does_not_depend_on_config_key_order() -> None:
    one = spec("fetch", config={"a": 1, "b": {"c": 2, "d": 3}})
    two = spec("fetch", config={"b": {"d": 3, "c": 2}, "a": 1})
    assert one.fingerprint == two.fingerprint

"""Workflow definitions: named DAGs of nodes (`workflows.node_spec`), with what starts their runs and
their runs' priority.

Mistakes about the graph (unknown dependencies, cycles, an empty workflow) fail in `Workflow.validate()`,
which the registry (`workflows.workflow_registry`) runs on `register`. Pure values and graph checks, no
I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from eventstore import InvalidInputError, NotFoundError
from workflows.definition_checks import DefinitionError, as_names, check_name, limit_names
from workflows.node_spec import NodeSpec, RetryPolicy
from workflows.run_sources import Schedule, Trigger

F = TypeVar("F", bound=Callable[..., Any])

#: A run's priority is a PostgreSQL integer (the queue's column).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


def check_priority(priority: object) -> int:
    """`priority` if it is an int a queue row can hold; InvalidInputError otherwise."""
    if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidInputError(f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    return priority


class Workflow:
    """A named DAG of nodes. Fan-out and fan-in are just several dependents or several dependencies.

    `triggers`: events in the log that each start a run; `schedule`: ticks that each start a run.
    `priority`: its runs' priority unless a start gives one; higher is claimed first within a tenant.
    `retention`: how long its ended runs stay in the run tables (workflows.retention); None: the
    LEDGERFLOW_RUN_RETENTION setting decides (by default, for ever)."""

    def __init__(
        self,
        name: str,
        version: str = "1",
        *,
        triggers: Iterable[Trigger] = (),
        schedule: Schedule | None = None,
        priority: int = 0,
        retention: timedelta | None = None,
    ) -> None:
        check_name("workflow", name)
        if retention is not None and (not isinstance(retention, timedelta) or retention <= timedelta(0)):
            raise DefinitionError(f"workflow {name!r}: retention must be a positive timedelta or None")
        self.retention = retention
        try:
            self.priority = check_priority(priority)
        except InvalidInputError as exc:
            raise DefinitionError(f"workflow {name!r}: {exc}") from None
        self.name = name
        self.version = version
        self.triggers = tuple(triggers)
        if not all(isinstance(t, Trigger) for t in self.triggers):
            raise DefinitionError(f"workflow {name!r}: triggers must be Trigger values")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise DefinitionError(f"workflow {name!r}: schedule must be a Schedule")
        self.schedule = schedule
        self._nodes: dict[str, NodeSpec] = {}
        self._sealed = False  # set on registration: the registry holds only validated graphs
        #: The topological order, kept once sealed (every node's end asks for it, twice).
        self._order: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version!r}, nodes={list(self._nodes)})"

    @property
    def nodes(self) -> Mapping[str, NodeSpec]:
        """The nodes by name, in declaration order (read-only)."""
        return MappingProxyType(self._nodes)

    def add_node(self, spec: NodeSpec) -> NodeSpec:
        if self._sealed:
            raise DefinitionError(
                f"workflow {self.name!r} is already registered; declare every node before registering it"
            )
        if spec.name in self._nodes:
            raise DefinitionError(f"workflow {self.name!r} already has a node named {spec.name!r}")
        self._nodes[spec.name] = spec
        return spec

    def node(
        self,
        *,
        name: str | None = None,
        depends_on: Iterable[str] = (),
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        progress_deadline: float | None = None,
        code_version: str = "1",
        config: Mapping[str, Any] | None = None,
        max_crashes: int = 5,
        on_stuck: Literal["retry", "fail"] = "retry",
        limits: Iterable[str] = (),
    ) -> Callable[[F], F]:
        """Declare a node with `@wf.node(...)`; the name defaults to the function's. The function is
        returned unchanged, so it can still be called directly in tests."""

        def declare(func: F) -> F:
            node_name = name if name is not None else func.__name__
            self.add_node(
                NodeSpec(
                    name=node_name,
                    fn=func,
                    depends_on=as_names(f"node {node_name!r}", depends_on),
                    retry=retry if retry is not None else RetryPolicy(),
                    timeout=timeout,
                    progress_deadline=progress_deadline,
                    code_version=code_version,
                    config=config if config is not None else {},
                    max_crashes=max_crashes,
                    on_stuck=on_stuck,
                    limits=limit_names(f"node {node_name!r}", limits),
                )
            )
            return func

        return declare

    def validate(self) -> None:
        """Raise DefinitionError unless this is a non-empty DAG whose dependencies all exist."""
        self.topological_order()

    def topological_order(self) -> list[str]:
        """Every node after all of its dependencies; ties go to the node declared first."""
        if self._order is not None:
            return list(self._order)
        order = self._sort()
        if self._sealed:
            self._order = tuple(order)
        return order

    def _sort(self) -> list[str]:
        if not self._nodes:
            raise DefinitionError(f"workflow {self.name!r} has no nodes")
        index = {name: i for i, name in enumerate(self._nodes)}
        for spec in self._nodes.values():
            if missing := [d for d in spec.depends_on if d not in index]:
                raise DefinitionError(
                    f"workflow {self.name!r}: node {spec.name!r} depends on unknown node(s) {missing}; "
                    f"known nodes: {list(index)}"
                )
        # Kahn's algorithm, with a heap keyed by declaration index so the order is deterministic.
        waiting = {name: len(spec.depends_on) for name, spec in self._nodes.items()}
        dependents = self._dependents()
        ready = [(i, name) for name, i in index.items() if waiting[name] == 0]
        order: list[str] = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(name)
            for child in dependents[name]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, (index[child], child))
        if len(order) < len(index):
            raise DefinitionError(
                f"workflow {self.name!r} has a dependency cycle: {self._find_cycle(set(index) - set(order))} "
                "(each node depends on the one before it)"
            )
        return order

    def _find_cycle(self, stuck: set[str]) -> str:
        # Every node Kahn's algorithm could not place has a dependency that is also stuck, so following
        # stuck dependencies from any stuck node must come back round to a node already visited.
        path = [next(n for n in self._nodes if n in stuck)]
        while path.count(path[-1]) < 2:
            path.append(next(d for d in self._nodes[path[-1]].depends_on if d in stuck))
        cycle = path[path.index(path[-1]) :][::-1][:-1]  # in flow order: dependency -> dependent
        start = min(range(len(cycle)), key=lambda i: list(self._nodes).index(cycle[i]))
        cycle = cycle[start:] + cycle[:start]
        return " -> ".join([*cycle, cycle[0]])

    def _dependents(self) -> dict[str, list[str]]:
        dependents: dict[str, list[str]] = {name: [] for name in self._nodes}
        for spec in self._nodes.values():
            for dep in spec.depends_on:
                dependents.setdefault(dep, []).append(spec.name)
        return dependents

    def roots(self) -> list[str]:
        """The nodes with no dependencies, in declaration order: they read the run's input."""
        return [name for name, spec in self._nodes.items() if not spec.depends_on]

    def descendants(self, name: str) -> set[str]:
        """Every node that depends on `name`, directly or through others (not `name` itself)."""
        if name not in self._nodes:
            raise NotFoundError(f"workflow {self.name!r} has no node {name!r}; nodes: {list(self._nodes)}")
        dependents = self._dependents()
        found: set[str] = set()
        todo = list(dependents[name])
        while todo:
            child = todo.pop()
            if child not in found:
                found.add(child)
                todo.extend(dependents[child])
        return found

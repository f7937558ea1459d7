"""Workflow definitions: named DAGs of nodes, each with a retry policy, deadlines and a fingerprint.

Pure values and graph checks, no I/O. Mistakes local to one node (a bad name, a self-dependency, a config
that is not JSON) fail when the node is declared; mistakes about the graph (unknown dependencies, cycles,
an empty workflow) fail in `Workflow.validate()`, which the registry runs on `register`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
import inspect
import json
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from croniter import croniter

from eventstore import InvalidInputError, NotFoundError

__all__ = [
    "DefinitionError",
    "Limit",
    "NodeSpec",
    "RetryPolicy",
    "Schedule",
    "Trigger",
    "Workflow",
    "WorkflowRegistry",
]

# Names end up in event payloads, log fields and metric labels, so they are kept to one safe alphabet.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
_RNG = random.Random()
F = TypeVar("F", bound=Callable[..., Any])


class DefinitionError(InvalidInputError):
    """A workflow definition is malformed; nothing was registered."""

    code = "invalid_definition"


def _check_name(kind: str, name: object) -> None:
    # fullmatch, not `$`: `$` also matches before a trailing newline.
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise DefinitionError(
            f"invalid {kind} name {name!r}: use 1 to 63 characters of a-z, 0-9 and _, starting with a letter"
        )


def _as_names(where: str, value: Iterable[str]) -> tuple[str, ...]:
    # A bare string is iterable too, and would silently become one dependency per character.
    if isinstance(value, str):
        raise DefinitionError(f"{where}: depends_on must be a list of node names, not the string {value!r}")
    return tuple(value)


def _json_problem(value: object, path: str) -> str | None:
    """Where `value` stops being plain JSON, or None. Stricter than `json.dumps`, which silently turns
    int keys into strings and writes NaN, which PostgreSQL's jsonb refuses."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}"
    if isinstance(value, list | tuple):
        return next((p for i, v in enumerate(value) if (p := _json_problem(v, f"{path}[{i}]"))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the non-string key {key!r}"
            if problem := _json_problem(item, f"{path}[{key!r}]"):
                return problem
        return None
    return f"{path} is a {type(value).__name__}"


def _canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failed node attempt is retried, and how long to wait between attempts."""

    max_attempts: int = 3
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2  # each wait is scaled by a random factor in [1 - jitter, 1 + jitter]
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    never_retry: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        problems = [
            ("max_attempts must be at least 1", self.max_attempts < 1),
            ("initial_backoff must not be negative", self.initial_backoff < 0),
            ("max_backoff must be at least initial_backoff", self.max_backoff < self.initial_backoff),
            ("multiplier must be at least 1", self.multiplier < 1),
            ("jitter must be between 0 and 1", not 0 <= self.jitter <= 1),
        ]
        if wrong := [text for text, failed in problems if failed]:
            raise DefinitionError(f"invalid retry policy {self!r}: {'; '.join(wrong)}")

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether this kind of failure may be retried; `never_retry` wins over `retry_on`. Signals that
        derive from BaseException only (lease lost, run cancelled) are not retried by the default."""
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.never_retry)

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based) before the next one.

        Hand-rolled rather than taken from tenacity: its wait strategies are callables of a
        `RetryCallState`, which needs a `Retrying` object, while our retries are durable (the attempt number
        comes from the event log, not from an in-process loop); its jittered waits draw from the global
        `random`, so a seeded `rng` cannot be passed in; and its jitter is additive
        (`wait_exponential_jitter`) or full (`wait_random_exponential`), not the proportional band here.
        """
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, got {attempt}")
        try:
            base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        except OverflowError:  # multiplier ** attempt exceeds a float long after the cap applies
            base = self.max_backoff
        spread = (rng if rng is not None else _RNG).uniform(-self.jitter, self.jitter)
        # Capped again after jitter, so max_backoff is a hard ceiling; at the cap, jitter only shortens.
        return min(self.max_backoff, base * (1 + spread))


@dataclass(frozen=True)
class Limit:
    """A limit shared by every worker: at most `concurrency` nodes naming it run at once, and at most
    `per_minute` of them start in any sliding minute (None: no bound of that kind)."""

    name: str
    concurrency: int | None = None
    per_minute: int | None = None

    def __post_init__(self) -> None:
        _check_name("limit", self.name)
        for bound in ("concurrency", "per_minute"):
            value = getattr(self, bound)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise DefinitionError(f"limit {self.name!r}: {bound} must be a whole number of at least 1")
        if self.concurrency is None and self.per_minute is None:
            raise DefinitionError(f"limit {self.name!r} bounds nothing: give concurrency, per_minute or both")


def _limit_names(where: str, value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise DefinitionError(f"{where}: limits must be a list of limit names, not the string {value!r}")
    names = tuple(value)
    for name in names:
        _check_name("limit", name)
    if len(set(names)) != len(names):
        raise DefinitionError(f"{where} lists a limit more than once: {list(names)}")
    return names


def _with_slot_check(fn: Callable[..., Any]) -> Callable[..., Any]:
    # Imported when the node runs: the check reads the queue, and definitions stay free of I/O.
    checked: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def checked(ctx: Any) -> Any:
            from workflows.limits import check_slots

            await asyncio.to_thread(check_slots, ctx)
            return await fn(ctx)

    else:

        def checked(ctx: Any) -> Any:
            from workflows.limits import check_slots

            check_slots(ctx)
            return fn(ctx)

    wrapped = functools.wraps(fn)(checked)
    setattr(wrapped, "_ledgerflow_slot_check", True)  # noqa: B010 - a marker mypy cannot type
    return wrapped


@dataclass(frozen=True)
class NodeSpec:
    """One node of a workflow: the function to run and the rules for running it."""

    name: str
    fn: Callable[..., Any]
    depends_on: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None  # seconds for one whole attempt
    progress_deadline: float | None = None  # seconds without reported progress before the node is stuck
    code_version: str = "1"  # bump when the function's output changes for the same input
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    max_crashes: int = 5  # reclaims after a crash before the node is parked for an operator
    #: What happens to a node that heartbeats but reports no progress past its deadline: "retry" takes
    #: it away from its worker and runs it again; "fail" records a failure (the retry policy applies).
    on_stuck: Literal["retry", "fail"] = "retry"
    #: Names of the registry's limits (`WorkflowRegistry.limit`) this node needs a slot of, across all
    #: workers, to be claimed; while one is full the node waits, as a ready row of the queue.
    limits: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_name("node", self.name)
        where = f"node {self.name!r}"
        deps = _as_names(where, self.depends_on)
        limits = _limit_names(where, self.limits)
        if limits and not getattr(self.fn, "_ledgerflow_slot_check", False):
            # A node's successor can be handed to the worker that ends the node without a claim of its
            # own: the node then checks, before its body runs, that it got the slots (workflows/limits.py).
            object.__setattr__(self, "fn", _with_slot_check(self.fn))
        object.__setattr__(self, "limits", limits)
        if self.name in deps:
            raise DefinitionError(f"{where} depends on itself")
        if len(set(deps)) != len(deps):
            raise DefinitionError(f"{where} lists a dependency more than once: {list(deps)}")
        for limit in ("timeout", "progress_deadline"):
            value = getattr(self, limit)
            if value is not None and not value > 0:
                raise DefinitionError(f"{where}: {limit} must be a positive number of seconds, got {value!r}")
        if self.max_crashes < 0:
            raise DefinitionError(f"{where}: max_crashes must not be negative, got {self.max_crashes}")
        if problem := _json_problem(dict(self.config), "config"):
            raise DefinitionError(f"{where}: config must be plain JSON, but {problem}")
        # A private copy in JSON form: the caller's dict may change later, and the node sees the same
        # config on its first run as after a crash, when it is read back from the log.
        object.__setattr__(self, "config", json.loads(_canonical_json(dict(self.config))))
        object.__setattr__(self, "depends_on", deps)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Identifies what this node computes, stable across processes and Python versions.

        Built from declared facts only (never `id()`, `hash()` or bytecode, which vary between processes or
        interpreters). Dependencies are sorted: listing them in another order computes the same thing.
        Computed once: the spec is frozen and its config a private copy, and every start records it.
        """
        facts = {
            "name": self.name,
            "code_version": self.code_version,
            "config": self.config,
            "depends_on": sorted(self.depends_on),
        }
        return hashlib.sha256(_canonical_json(facts).encode()).hexdigest()


@dataclass(frozen=True)
class Trigger:
    """Start one run of the workflow for every event of type `event_type` appended to the log (only in
    streams of `category`, the part of the stream id before its first `-`, when given). The run's input
    is the event (see `workflows.triggers.trigger_input`); it runs in the event's tenant."""

    event_type: str
    category: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.event_type, str) or not self.event_type.strip():
            raise DefinitionError(f"a trigger needs an event type, got {self.event_type!r}")
        if self.category is not None and (
            not isinstance(self.category, str) or not self.category or "-" in self.category
        ):
            raise DefinitionError(
                f"a trigger's category is a stream id's part before its first '-', got {self.category!r}"
            )


CatchUp = Literal["skip", "all"]


@dataclass(frozen=True)
class Schedule:
    """Start one run per tick of `cron` (UTC; five fields, or six with seconds last), across all workers.

    `catch_up` says what happens to ticks that passed while no worker ran: "skip" starts at most one run,
    for the latest of them; "all" starts one per missed tick, at most `max_catch_up` (the latest ones).
    Runs belong to `tenant` and get `{"tick": <ISO 8601 time of the tick>}` as their input."""

    cron: str
    catch_up: CatchUp = "skip"
    max_catch_up: int = 100
    tenant: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise DefinitionError(f"invalid cron expression {self.cron!r}, e.g. '*/5 * * * *'")
        if self.catch_up not in ("skip", "all"):
            raise DefinitionError(f"catch_up must be 'skip' or 'all', got {self.catch_up!r}")
        if not isinstance(self.max_catch_up, int) or self.max_catch_up < 1:
            raise DefinitionError(f"max_catch_up must be at least 1, got {self.max_catch_up!r}")


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
        _check_name("workflow", name)
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
                    depends_on=_as_names(f"node {node_name!r}", depends_on),
                    retry=retry if retry is not None else RetryPolicy(),
                    timeout=timeout,
                    progress_deadline=progress_deadline,
                    code_version=code_version,
                    config=config if config is not None else {},
                    max_crashes=max_crashes,
                    on_stuck=on_stuck,
                    limits=_limit_names(f"node {node_name!r}", limits),
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


_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def version_order(version: str) -> tuple[tuple[int, int, str], ...]:
    """Which of two versions is newer: numbers by value, the rest as text ("2" < "10" < "10b")."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|\D+", version)
    )


def _check_version(wf: Workflow) -> str:
    """`wf.version` as the text runs record (a whole number written as a number is taken as its text)."""
    version: object = wf.version
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        version = wf.version = str(version)
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise DefinitionError(
            f"workflow {wf.name!r}: invalid version {version!r}: use 1 to 63 letters, digits, '.', '_' or '-'"
        )
    return version


class WorkflowRegistry:
    """The workflows a process knows, by name and version. Registration validates and then freezes a
    workflow; several versions of one name may be registered, so that runs started with an older
    version go on with it."""

    def __init__(self) -> None:
        #: By name, the newest version; `_versions`: by name, every version.
        self._workflows: dict[str, Workflow] = {}
        self._versions: dict[str, dict[str, Workflow]] = {}
        self._limits: dict[str, Limit] = {}

    def limit(self, name: str, *, concurrency: int | None = None, per_minute: int | None = None) -> Limit:
        """Declare a limit that nodes name in `limits=[...]`: at most `concurrency` of them running at
        once and at most `per_minute` starts in any sliding minute, across every worker and host."""
        declared = Limit(name, concurrency, per_minute)
        if self._limits.get(name, declared) != declared:
            raise DefinitionError(f"limit {name!r} is already declared as {self._limits[name]!r}")
        self._limits[name] = declared
        return declared

    @property
    def limits(self) -> Mapping[str, Limit]:
        """The declared limits by name (read-only)."""
        return MappingProxyType(self._limits)

    def register(self, wf: Workflow) -> Workflow:
        """Register `wf`: a new workflow, or another version of one already registered (a run goes on
        with the version it started with; new runs start with the newest)."""
        version = _check_version(wf)
        versions = self._versions.setdefault(wf.name, {})
        existing = versions.get(version)
        if existing is wf:
            return wf
        if existing is not None:
            raise DefinitionError(
                f"a different workflow named {wf.name!r} is already registered with version {version!r}; "
                "give the changed definition a new version"
            )
        wf.validate()
        wf._sealed = True
        versions[version] = wf
        # By name, the newest version: what new runs start with.
        self._workflows[wf.name] = versions[max(versions, key=version_order)]
        return wf

    def get(self, name: str, version: str | None = None) -> Workflow:
        """The workflow's newest version, or the `version` named (NotFoundError if it is not here)."""
        if name not in self._workflows:
            known = ", ".join(map(repr, self.names())) or "none"
            raise NotFoundError(f"no workflow named {name!r} is registered; known workflows: {known}")
        if version is None:
            return self._workflows[name]
        found = self._versions[name].get(str(version))
        if found is None:
            raise NotFoundError(
                f"workflow {name!r} has no version {version!r} here; registered versions: "
                f"{', '.join(map(repr, self.versions(name)))}"
            )
        return found

    def versions(self, name: str) -> list[str]:
        """The registered versions of `name`, oldest first (empty if it is not registered)."""
        return sorted(self._versions.get(name, {}), key=version_order)

    def name_versions(self) -> list[tuple[str, str]]:
        """(name, version) of every registered workflow version: what a worker claims nodes of."""
        return [(wf.name, wf.version) for wf in self.definitions()]

    def definitions(self) -> list[Workflow]:
        """Every registered workflow, every version: by name, oldest version first."""
        return [self._versions[n][v] for n in self.names() for v in self.versions(n)]

    def names(self) -> list[str]:
        return sorted(self._workflows)

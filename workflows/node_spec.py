"""One node of a workflow as declared: its function, dependencies, retry policy, deadlines, config and
fingerprint. Mistakes local to one node (a bad name, a self-dependency, a config that is not JSON) fail
when it is declared; apart from the graph (`workflows.definition`), which checks the nodes together.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workflows.definition_checks import (
    DefinitionError,
    as_names,
    canonical_json,
    check_name,
    json_problem,
    limit_names,
)

_RNG = random.Random()


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
        check_name("node", self.name)
        where = f"node {self.name!r}"
        deps = as_names(where, self.depends_on)
        limits = limit_names(where, self.limits)
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
        if problem := json_problem(dict(self.config), "config"):
            raise DefinitionError(f"{where}: config must be plain JSON, but {problem}")
        # A private copy in JSON form: the caller's dict may change later, and the node sees the same
        # config on its first run as after a crash, when it is read back from the log.
        object.__setattr__(self, "config", json.loads(canonical_json(dict(self.config))))
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
        return hashlib.sha256(canonical_json(facts).encode()).hexdigest()

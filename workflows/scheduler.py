"""Pure scheduling decisions over the statuses of a run's nodes: what may start, how the run stands,
what to run again. No I/O: callers read statuses from the projections and record the decisions as events.

A node with no recorded status counts as pending (it has not started); statuses for names that are not
nodes of the workflow are ignored. Statuses compare by value, so plain strings read back from the database
work as well as `NodeStatus` members.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Literal

from workflows.definition import Workflow

__all__ = ["NodeStatus", "nodes_to_rerun", "retry_from_failed", "run_outcome", "runnable_nodes"]


class NodeStatus(StrEnum):
    PENDING = "pending"  # waiting for its dependencies
    READY = "ready"  # dependencies succeeded, waiting for a worker
    RUNNING = "running"
    WAITING = "waiting"  # suspended by a timer or a signal wait; holds no worker until it wakes
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # out of attempts, or the error was not retryable
    RETRY_SCHEDULED = "retry_scheduled"  # failed an attempt, the next one is due later
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    PARKED = "parked"  # crashed too often; waits for an operator


# Statuses from which a node will not move on its own. None of them lets its dependents start (only
# SUCCEEDED does), so everything downstream of one stays pending until an operator retries the run.
_DEAD_ENDS = frozenset({NodeStatus.FAILED, NodeStatus.PARKED, NodeStatus.CANCELLED, NodeStatus.SKIPPED})

Outcome = Literal["running", "succeeded", "failed", "cancelled"]


def _status(statuses: Mapping[str, NodeStatus], name: str) -> NodeStatus:
    return statuses.get(name, NodeStatus.PENDING)


def runnable_nodes(wf: Workflow, statuses: Mapping[str, NodeStatus]) -> list[str]:
    """The pending nodes whose dependencies have all succeeded, in topological order."""
    return [
        name
        for name in wf.topological_order()
        if _status(statuses, name) == NodeStatus.PENDING
        and all(_status(statuses, dep) == NodeStatus.SUCCEEDED for dep in wf.nodes[name].depends_on)
    ]


def run_outcome(wf: Workflow, statuses: Mapping[str, NodeStatus]) -> Outcome:
    """How the run stands. It is "running" while any node is in flight or pending with a chance to run;
    once nothing more can happen it is "failed" if a node failed or was parked, else "cancelled" if one was
    cancelled, else "succeeded" (every node succeeded, or was skipped, or waits behind a skipped one)."""
    blocked: set[str] = set()  # nodes that can never run again without an operator
    for name in wf.topological_order():  # dependencies are decided before their dependents
        status = _status(statuses, name)
        if status in _DEAD_ENDS or (
            status == NodeStatus.PENDING and any(dep in blocked for dep in wf.nodes[name].depends_on)
        ):
            blocked.add(name)
        elif status != NodeStatus.SUCCEEDED:
            return "running"  # in flight, or pending behind nodes that may still succeed
    settled = {_status(statuses, name) for name in wf.nodes}
    if settled & {NodeStatus.FAILED, NodeStatus.PARKED}:
        return "failed"
    if NodeStatus.CANCELLED in settled:
        return "cancelled"
    return "succeeded"


def _with_descendants(wf: Workflow, names: Iterable[str]) -> set[str]:
    found = set(names)
    for name in list(found):
        found |= wf.descendants(name)
    return found


def nodes_to_rerun(
    wf: Workflow,
    old_fingerprints: Mapping[str, str],
    new_fingerprints: Mapping[str, str],
    input_changed: bool,
) -> set[str]:
    """The nodes to run again when a completed run is refreshed: those whose fingerprint changed (a node
    missing from either mapping counts as changed, since rerunning is always safe and skipping is not),
    the roots if the run's input changed, and everything downstream of those."""
    changed = {
        name
        for name in wf.nodes
        if name not in old_fingerprints or old_fingerprints[name] != new_fingerprints.get(name)
    }
    if input_changed:
        changed.update(wf.roots())
    return _with_descendants(wf, changed)


def retry_from_failed(wf: Workflow, statuses: Mapping[str, NodeStatus]) -> set[str]:
    """The nodes that go back to pending when an operator retries a run: every failed, parked or cancelled
    node, and those of their descendants that have not succeeded. Succeeded nodes keep their results."""
    stopped = {
        name
        for name in wf.nodes
        if _status(statuses, name) in {NodeStatus.FAILED, NodeStatus.PARKED, NodeStatus.CANCELLED}
    }
    return {
        name for name in _with_descendants(wf, stopped) if _status(statuses, name) != NodeStatus.SUCCEEDED
    }

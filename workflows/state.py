"""A run's state, folded from its stream. Pure: no I/O.

The worker folds a run's events to know what its node may reuse (checkpoints, memoized steps, the
outputs of its dependencies) and what to decide next; the run and node tables are the same fold,
kept by a projection.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventstore import RecordedEvent
from workflows import events as ev
from workflows.scheduler import NodeStatus

#: Events after which a node is no longer in flight.
TERMINAL_RUN = {"succeeded", "failed", "cancelled"}


@dataclass
class NodeState:
    name: str
    status: NodeStatus = NodeStatus.PENDING
    attempt: int = 0
    failures: int = 0
    crashes: int = 0
    token: int | None = None
    worker: str | None = None
    output: Any = None
    generation: int | None = None
    error: str | None = None
    progress: tuple[int, int | None, str] | None = None
    checkpoints: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, Any] = field(default_factory=dict)
    children: dict[str, str] = field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class RunState:
    run_id: uuid.UUID
    tenant: str
    workflow: str = ""
    key: str | None = None
    input: Any = None
    input_fingerprint: str = ""
    fingerprints: dict[str, str] = field(default_factory=dict)
    status: str = "running"
    cancel_requested: bool = False
    error: str | None = None
    nodes: dict[str, NodeState] = field(default_factory=dict)
    version: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def node(self, name: str) -> NodeState:
        if name not in self.nodes:
            self.nodes[name] = NodeState(name)
        return self.nodes[name]

    @property
    def statuses(self) -> dict[str, NodeStatus]:
        return {name: n.status for name, n in self.nodes.items()}

    @property
    def active(self) -> bool:
        return self.status not in TERMINAL_RUN


def fold(run_id: uuid.UUID, tenant: str, events: Iterable[RecordedEvent]) -> RunState:
    run = RunState(run_id, tenant)
    for e in events:
        apply(run, e)
    return run


def apply(run: RunState, e: RecordedEvent) -> None:
    d = e.data
    run.version = e.stream_version
    t = e.type
    if t == ev.RUN_STARTED:
        run.workflow, run.key, run.input = d["workflow"], d.get("key"), d.get("input")
        run.input_fingerprint, run.fingerprints = d["input_fingerprint"], dict(d["fingerprints"])
        run.started_at = e.recorded_at
        for name in run.fingerprints:
            run.node(name)
        return
    if t == ev.NODES_READY:
        for name in d["nodes"]:
            run.node(name).status = NodeStatus.READY
        return
    if t in (ev.RUN_CANCEL_REQUESTED,):
        run.cancel_requested = True
        return
    if t == ev.RUN_COMPLETED:
        run.status, run.finished_at = "succeeded", e.recorded_at
        return
    if t == ev.RUN_FAILED:
        run.status, run.error, run.finished_at = "failed", d.get("error"), e.recorded_at
        return
    if t == ev.RUN_CANCELLED:
        run.status, run.finished_at = "cancelled", e.recorded_at
        return
    if t == ev.RUN_RETRIED:
        run.status, run.error, run.finished_at, run.cancel_requested = "running", None, None, False
        for name in d["nodes"]:
            n = run.node(name)
            # Retry keeps checkpoints and memoized steps: work already paid for is not paid again.
            n.status, n.error, n.failures, n.crashes = NodeStatus.PENDING, None, 0, 0
        return
    if t == ev.RUN_REFRESHED:
        run.status, run.error, run.finished_at, run.cancel_requested = "running", None, None, False
        run.input, run.input_fingerprint = d.get("input"), d["input_fingerprint"]
        run.fingerprints = dict(d["fingerprints"])
        for name in d["nodes"]:
            # New input or new code: earlier checkpoints and steps answer another question; start afresh.
            old = run.node(name)
            run.nodes[name] = NodeState(name, attempt=old.attempt)
        return
    if t in (ev.KEY_CLAIMED, ev.KEY_RELEASED):
        return
    n = run.node(d["node"])
    if t == ev.NODE_CLAIMED:
        n.status, n.attempt, n.token, n.worker = NodeStatus.RUNNING, d["attempt"], d["token"], d["worker"]
        n.started_at, n.progress = e.recorded_at, None
    elif t == ev.NODE_PROGRESS:
        n.progress = (d["current"], d.get("total"), d.get("message", ""))
    elif t == ev.NODE_CHECKPOINT:
        n.checkpoints[d["item"]] = d.get("output")
    elif t == ev.STEP_RECORDED:
        n.steps[d["key"]] = d.get("result")
    elif t == ev.CHILD_STARTED:
        n.children[d["key"]] = d["child_run_id"]
    elif t == ev.NODE_SUCCEEDED:
        n.status, n.output, n.generation = NodeStatus.SUCCEEDED, d.get("output"), d["generation"]
        n.error, n.token, n.finished_at = None, None, e.recorded_at
    elif t == ev.NODE_RETRY_SCHEDULED:
        n.status, n.error, n.failures, n.token = NodeStatus.RETRY_SCHEDULED, d["error"], n.failures + 1, None
    elif t == ev.NODE_FAILED:
        n.status, n.error, n.token, n.finished_at = NodeStatus.FAILED, d["error"], None, e.recorded_at
        n.failures += 1
    elif t in (ev.NODE_RECLAIMED, ev.NODE_RELEASED):
        n.status, n.token = NodeStatus.READY, None
        if t == ev.NODE_RECLAIMED:
            n.crashes += 1
    elif t == ev.NODE_PARKED:
        n.status, n.token, n.error = NodeStatus.PARKED, None, d.get("error")
        n.crashes = d.get("crashes", n.crashes)
    elif t == ev.NODE_CANCELLED:
        n.status, n.token, n.finished_at = NodeStatus.CANCELLED, None, e.recorded_at
    elif t == ev.NODE_STUCK:
        pass  # a flag for operators; what follows (reclaim or failure) has its own event

"""A run's state (`workflows.run_state`), folded from its stream. Pure: no I/O.

This fold is the only place a workflow event changes a run. The worker folds a run's events to know what
its node may reuse (checkpoints, memoized steps, the outputs of its dependencies) and what to decide next;
the run and node tables (`workflows.projections`) are rows of the same state, kept by applying this fold
to the events a projector reads.

Each event type has one small function below (`_APPLY`, keyed by the event's model). Every event except
a memo (a recorded step, a started child) also stamps `updated_at` on the run and on the nodes it names,
with the event's recorded time: never the clock, so a rebuild gives the same rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from eventstore import RecordedEvent
from workflows import event_codec as codec
from workflows import event_models as em
from workflows import node_event_models as nem
from workflows.run_state import NodeState, ReceivedSignal, RunState, json_bytes
from workflows.scheduler import NodeStatus
from workflows.tags import apply_tags


def fold(run_id: uuid.UUID, tenant: str, events: Iterable[RecordedEvent]) -> RunState:
    run = RunState(run_id, tenant)
    for e in events:
        apply(run, e)
    return run


def apply(run: RunState, e: RecordedEvent) -> None:
    """Apply one recorded event of the run's stream. Types that are not workflow events carry nothing
    for the run; a workflow event whose payload does not fit its model raises WorkflowEventError."""
    run.version = e.stream_version
    if codec.is_workflow_event(e):
        apply_event(run, codec.parse(e), e.recorded_at)


def apply_event(run: RunState, event: em.WorkflowEvent, at: datetime) -> None:
    """Apply one typed event, recorded at `at`."""
    change = _APPLY.get(type(event))
    if change is None:
        return  # key events live in the key's stream and change no run
    if not isinstance(event, _MEMOS):
        run.updated_at = at
    change(run, event, at)


# -- one function per event type ------------------------------------------------------------------

E = TypeVar("E", bound=em.WorkflowEvent)
Change = Callable[[RunState, Any, datetime], None]
_APPLY: dict[type[em.WorkflowEvent], Change] = {}
#: Memos record what a node may reuse; they change no row of the tables and are not read by them.
_MEMOS = (nem.StepRecorded, nem.ChildStarted, nem.SignalReceived, nem.SignalTaken)


def _on(model: type[E]) -> Callable[[Callable[[RunState, E, datetime], None]], Change]:
    def register(fn: Callable[[RunState, E, datetime], None]) -> Change:
        _APPLY[model] = fn
        return fn

    return register


def _held(n: NodeState, held: dict[str, Any], key: str, value: Any) -> None:
    """`held[key] = value` (a node's steps or checkpoints), counted in the node's held bytes."""
    if key in held:
        n.held_bytes -= json_bytes(held[key])
    held[key] = value
    n.held_bytes += json_bytes(value)


def _touched(run: RunState, name: str, at: datetime) -> NodeState:
    n = run.node(name)
    n.updated_at = at
    return n


@_on(em.RunStarted)
def _run_started(run: RunState, e: em.RunStarted, at: datetime) -> None:
    run.workflow, run.key, run.input = e.workflow, e.key, e.input
    run.input_fingerprint, run.fingerprints = e.input_fingerprint, dict(e.fingerprints)
    run.triggered_by = e.triggered_by
    run.workflow_version = str(e.version)
    run.priority = e.priority
    run.tags = dict(e.tags)
    run.parent = e.parent
    run.continued_from = e.continued_from
    run.started_at = at
    for name in [*e.nodes, *e.fingerprints]:
        _touched(run, name, at)


@_on(em.RunTagged)
def _run_tagged(run: RunState, e: em.RunTagged, at: datetime) -> None:
    run.tags = apply_tags(run.tags, e.tags)


@_on(em.NodesReady)
def _nodes_ready(run: RunState, e: em.NodesReady, at: datetime) -> None:
    for name in e.nodes:
        _touched(run, name, at).status = NodeStatus.READY


@_on(em.RunCancelRequested)
def _cancel_requested(run: RunState, e: em.RunCancelRequested, at: datetime) -> None:
    run.cancel_requested = True
    if run.status == "paused":  # a cancellation ends the pause (its queue side: `cancel_run`)
        run.status = "running"


@_on(em.RunPaused)
def _run_paused(run: RunState, e: em.RunPaused, at: datetime) -> None:
    run.status = "paused"


@_on(em.RunResumed)
def _run_resumed(run: RunState, e: em.RunResumed, at: datetime) -> None:
    run.status = "running"


def _ended(run: RunState, status: str, error: str | None, at: datetime) -> None:
    run.status, run.error, run.finished_at, run.current_node = status, error, at, None


@_on(em.RunCompleted)
def _run_completed(run: RunState, e: em.RunCompleted, at: datetime) -> None:
    _ended(run, "succeeded", None, at)


@_on(em.RunFailed)
def _run_failed(run: RunState, e: em.RunFailed, at: datetime) -> None:
    _ended(run, "failed", e.error, at)


@_on(em.RunCancelled)
def _run_cancelled(run: RunState, e: em.RunCancelled, at: datetime) -> None:
    _ended(run, "cancelled", None, at)


@_on(em.RunContinuedAsNew)
def _run_continued(run: RunState, e: em.RunContinuedAsNew, at: datetime) -> None:
    run.continued_as = e.successor_run_id
    _ended(run, "continued", None, at)


def _reopened(run: RunState) -> None:
    # A paused run with parked nodes retried stays paused: its nodes made ready wait for the resume.
    status = "paused" if run.status == "paused" else "running"
    run.status, run.error, run.finished_at, run.cancel_requested = status, None, None, False


@_on(em.RunRetried)
def _run_retried(run: RunState, e: em.RunRetried, at: datetime) -> None:
    _reopened(run)
    for name in e.nodes:
        n = _touched(run, name, at)
        # Retry keeps checkpoints and memoized steps: work already paid for is not paid again.
        n.status, n.error, n.failures, n.crashes = NodeStatus.PENDING, None, 0, 0
        n.finished_at, n.stuck = None, False


@_on(em.RunRefreshed)
def _run_refreshed(run: RunState, e: em.RunRefreshed, at: datetime) -> None:
    _reopened(run)
    run.input, run.input_fingerprint, run.fingerprints = e.input, e.input_fingerprint, dict(e.fingerprints)
    for name in e.nodes:
        # New input or new code: earlier checkpoints and steps answer another question; start afresh.
        old = run.node(name)
        run.nodes[name] = NodeState(name, attempt=old.attempt, position=old.position, updated_at=at)


@_on(nem.NodeClaimed)
def _node_claimed(run: RunState, e: nem.NodeClaimed, at: datetime) -> None:
    n = _touched(run, e.node, at)
    if n.status is NodeStatus.WAITING:
        n.wakes += 1
    n.status, n.attempt, n.token, n.worker = NodeStatus.RUNNING, e.attempt, e.token, e.worker
    n.started_at, n.finished_at, n.duration_ms, n.progress, n.stuck = at, None, None, None, False
    n.waiting_for, n.wake_at = None, None
    run.current_node = e.node


@_on(nem.NodeProgress)
def _node_progress(run: RunState, e: nem.NodeProgress, at: datetime) -> None:
    _touched(run, e.node, at).progress = (e.current, e.total, e.message)


@_on(nem.NodeCheckpoint)
def _node_checkpoint(run: RunState, e: nem.NodeCheckpoint, at: datetime) -> None:
    n = _touched(run, e.node, at)
    _held(n, n.checkpoints, e.item, e.output)
    n.checkpoints_taken += 1


@_on(nem.StepRecorded)
def _step_recorded(run: RunState, e: nem.StepRecorded, at: datetime) -> None:
    n = run.node(e.node)
    _held(n, n.steps, e.key, e.result)


@_on(nem.ChildStarted)
def _child_started(run: RunState, e: nem.ChildStarted, at: datetime) -> None:
    run.node(e.node).children[e.key] = e.child_run_id


@_on(nem.NodeSucceeded)
def _node_succeeded(run: RunState, e: nem.NodeSucceeded, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.held_bytes += (json_bytes(e.output) if e.output is not None else 0) - (
        json_bytes(n.output) if n.output is not None else 0
    )
    n.status, n.output, n.generation, n.duration_ms = (
        NodeStatus.SUCCEEDED,
        e.output,
        e.generation,
        e.duration_ms,
    )
    n.error, n.token, n.finished_at = None, None, at


@_on(nem.NodeRetryScheduled)
def _node_retry_scheduled(run: RunState, e: nem.NodeRetryScheduled, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.status, n.error, n.token = NodeStatus.RETRY_SCHEDULED, e.error, None
    n.failures += 1


@_on(nem.NodeFailed)
def _node_failed(run: RunState, e: nem.NodeFailed, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.status, n.error, n.token, n.finished_at = NodeStatus.FAILED, e.error, None, at
    n.failures += 1


@_on(nem.NodeReclaimed)
def _node_reclaimed(run: RunState, e: nem.NodeReclaimed, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.status, n.token, n.worker = NodeStatus.READY, None, None
    n.crashes += 1


@_on(nem.NodeReleased)
def _node_released(run: RunState, e: nem.NodeReleased, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.status, n.token, n.worker = NodeStatus.READY, None, None  # a hand-over, not a crash


@_on(nem.NodeStuck)
def _node_stuck(run: RunState, e: nem.NodeStuck, at: datetime) -> None:
    # A flag for operators; what follows (reclaim or failure) has its own event.
    _touched(run, e.node, at).stuck = True


@_on(nem.NodeParked)
def _node_parked(run: RunState, e: nem.NodeParked, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.status, n.token, n.error = NodeStatus.PARKED, None, e.error
    if e.crashes is not None:
        n.crashes = e.crashes


@_on(nem.NodeCancelled)
def _node_cancelled(run: RunState, e: nem.NodeCancelled, at: datetime) -> None:
    n = _touched(run, e.node, at)
    n.status, n.token, n.finished_at = NodeStatus.CANCELLED, None, at


@_on(nem.NodeWaiting)
def _node_waiting(run: RunState, e: nem.NodeWaiting, at: datetime) -> None:
    n = _touched(run, e.node, at)
    until = datetime.fromisoformat(e.until) if e.until is not None else None
    n.status, n.token, n.worker = NodeStatus.WAITING, None, None
    n.waits.setdefault(e.key, until)
    n.waiting_for, n.wake_at = e.signal, until


@_on(nem.SignalReceived)
def _signal_received(run: RunState, e: nem.SignalReceived, at: datetime) -> None:
    # `run.version` is this event's: `apply` sets it first.
    run.signals.append(ReceivedSignal(e.name, at, run.version))


@_on(nem.SignalTaken)
def _signal_taken(run: RunState, e: nem.SignalTaken, at: datetime) -> None:
    run.node(e.node).taken[e.key] = e.index
    if e.index is not None:
        run.signals_taken.add(e.index)

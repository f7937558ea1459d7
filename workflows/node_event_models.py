"""The payload models of a node's events and of the waits (the signals sent to the run among them): one
frozen pydantic model per event type, as in `workflows.event_models`."""

from __future__ import annotations

from typing import Any, ClassVar

from workflows.event_models import WorkflowEvent
from workflows.events import (
    CHILD_STARTED,
    NODE_CANCELLED,
    NODE_CHECKPOINT,
    NODE_CLAIMED,
    NODE_FAILED,
    NODE_PARKED,
    NODE_PROGRESS,
    NODE_RECLAIMED,
    NODE_RELEASED,
    NODE_RETRY_SCHEDULED,
    NODE_STUCK,
    NODE_SUCCEEDED,
    NODE_WAITING,
    SIGNAL_RECEIVED,
    SIGNAL_TAKEN,
    STEP_RECORDED,
)


class NodeEvent(WorkflowEvent):
    """An event about one node of the run."""

    node: str


# -- a node ---------------------------------------------------------------------------------------


class NodeClaimed(NodeEvent):
    event_type: ClassVar[str] = NODE_CLAIMED
    attempt: int
    token: int
    worker: str


class NodeProgress(NodeEvent):
    event_type: ClassVar[str] = NODE_PROGRESS
    current: int
    total: int | None = None
    message: str = ""


class NodeCheckpoint(NodeEvent):
    event_type: ClassVar[str] = NODE_CHECKPOINT
    attempt: int | None = None
    item: str
    output: Any = None


class StepRecorded(NodeEvent):
    event_type: ClassVar[str] = STEP_RECORDED
    attempt: int | None = None
    key: str
    result: Any = None


class ChildStarted(NodeEvent):
    event_type: ClassVar[str] = CHILD_STARTED
    key: str
    child_run_id: str
    workflow: str | None = None
    #: The child's parent-close policy (absent for children started before there were policies).
    parent_close: str | None = None


class NodeSucceeded(NodeEvent):
    event_type: ClassVar[str] = NODE_SUCCEEDED
    attempt: int | None = None
    generation: int
    output: Any = None
    duration_ms: float | None = None


class NodeRetryScheduled(NodeEvent):
    event_type: ClassVar[str] = NODE_RETRY_SCHEDULED
    attempt: int | None = None
    error: str
    retry_in: float | None = None


class NodeFailed(NodeEvent):
    event_type: ClassVar[str] = NODE_FAILED
    attempt: int | None = None
    error: str
    error_class: str | None = None


class NodeReclaimed(NodeEvent):
    """Its worker's lease lapsed (a crash) or it was stuck: the node is ready for another worker."""

    event_type: ClassVar[str] = NODE_RECLAIMED
    attempt: int | None = None
    previous_worker: str | None = None
    reason: str | None = None


class NodeReleased(NodeEvent):
    """Its worker handed it back (graceful shutdown): ready for another worker, and not a crash."""

    event_type: ClassVar[str] = NODE_RELEASED
    worker: str | None = None
    #: Why, when not a worker's shutdown: "paused" (the run was paused with its running nodes interrupted).
    reason: str | None = None


class NodeStuck(NodeEvent):
    event_type: ClassVar[str] = NODE_STUCK
    seconds: float | None = None
    #: What recovery does about it: "retry" (a reclaim follows) or "fail".
    action: str | None = None


class NodeParked(NodeEvent):
    event_type: ClassVar[str] = NODE_PARKED
    #: Absent in a payload: the node's crash count stays as it was.
    crashes: int | None = None
    error: str | None = None


class NodeCancelled(NodeEvent):
    event_type: ClassVar[str] = NODE_CANCELLED


# -- waiting --------------------------------------------------------------------------------------


class NodeWaiting(NodeEvent):
    """The node suspended itself and holds no worker: until `until` (a timer's due time, or a signal
    wait's timeout), or, for a signal wait, until `signal` arrives. When it wakes, its body runs again from
    the start, with its recorded steps, checkpoints and waits replayed from the log."""

    event_type: ClassVar[str] = NODE_WAITING
    attempt: int
    #: Which wait of the node's body this is (stable across runs of the body: see NodeContext).
    key: str
    #: ISO 8601 with a UTC offset; None: a signal wait without a timeout.
    until: str | None = None
    signal: str | None = None


class SignalReceived(WorkflowEvent):
    """A signal sent to the run (`Engine.signal`): kept in the log until a node's wait takes it, so a
    signal sent before the node waits is not lost."""

    event_type: ClassVar[str] = SIGNAL_RECEIVED
    name: str
    payload: Any = None
    actor: str | None = None


class SignalTaken(NodeEvent):
    """A node's wait ended: it took the run's `index`-th signal (0-based, in the order received), or
    timed out (`index` None). A memo: the body, run again, gets the same answer from it."""

    event_type: ClassVar[str] = SIGNAL_TAKEN
    attempt: int | None = None
    key: str
    name: str
    index: int | None = None

"""The payload models of the workflow events: one frozen pydantic model per event type, naming the fields
its payload carries (the type names are in `workflows.events`)."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from workflows.events import (
    CHILD_STARTED,
    KEY_CLAIMED,
    KEY_RELEASED,
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
    NODES_READY,
    RUN_CANCEL_REQUESTED,
    RUN_CANCELLED,
    RUN_COMPLETED,
    RUN_CONTINUED_AS_NEW,
    RUN_FAILED,
    RUN_PAUSED,
    RUN_REFRESHED,
    RUN_RELEASED,
    RUN_RESTORED,
    RUN_RESUMED,
    RUN_RETRIED,
    RUN_STARTED,
    RUN_TAGGED,
    SIGNAL_RECEIVED,
    SIGNAL_TAKEN,
    STEP_RECORDED,
)


class WorkflowEvent(BaseModel):
    """What every workflow event carries: the run it belongs to. Unknown payload fields are ignored when
    a recorded event is read (older or newer writers), but refused when one is built (`event()`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_type: ClassVar[str]
    run_id: uuid.UUID


class NodeEvent(WorkflowEvent):
    """An event about one node of the run."""

    node: str


# -- the run --------------------------------------------------------------------------------------


class TriggeringEvent(BaseModel):
    """The log event whose arrival started a run (see `workflows.triggers`): where it is in the log."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_id: str
    stream_id: str
    type: str
    transaction_id: int
    position: int


#: What happens to a child run when its parent is cancelled, fails or is paused (`parent_close=` of
#: `NodeContext.start_workflow`): the same (`cancel`: its running nodes finish first), the same at once
#: (`terminate`: its running nodes are not let finish), or nothing (`abandon`).
PARENT_CLOSE_POLICIES = ("terminate", "cancel", "abandon")
ParentClose = Literal["terminate", "cancel", "abandon"]


class ParentLink(BaseModel):
    """The run whose node started this one (`NodeContext.start_workflow`), and what this run does when
    that run is cancelled, fails or is paused (workflows.children)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: str
    node: str
    parent_close: ParentClose = "cancel"


class RunStarted(WorkflowEvent):
    event_type: ClassVar[str] = RUN_STARTED
    workflow: str
    version: str | int = "1"  # the definition's version, as its author wrote it
    key: str | None = None
    input: Any = None
    input_fingerprint: str
    #: Every node, in topological order (jsonb does not keep the key order of `fingerprints`).
    nodes: list[str]
    fingerprints: dict[str, str]
    #: Set when an event in the log started the run (a trigger), absent for every other start.
    triggered_by: TriggeringEvent | None = None
    #: Higher is claimed first among its tenant's ready nodes; absent (0) for most starts. The queue's rows
    #: take it from here (migration 0028), so they can be rebuilt from the log.
    priority: int = 0
    #: Key/value tags given at the start (`Engine.start(tags=)`), absent when none: see workflows.tags.
    tags: dict[str, str] = {}
    #: Set for a run a node of another run started (a child run), absent for every other start.
    parent: ParentLink | None = None
    #: Set for a run that another run's `continue_as_new` started (its successor), absent otherwise.
    continued_from: str | None = None


class NodesReady(WorkflowEvent):
    event_type: ClassVar[str] = NODES_READY
    nodes: list[str]


class RunCancelRequested(WorkflowEvent):
    event_type: ClassVar[str] = RUN_CANCEL_REQUESTED
    actor: str | None = None


class RunRetried(WorkflowEvent):
    event_type: ClassVar[str] = RUN_RETRIED
    nodes: list[str]
    actor: str | None = None


class RunRefreshed(WorkflowEvent):
    event_type: ClassVar[str] = RUN_REFRESHED
    input: Any = None
    input_fingerprint: str
    fingerprints: dict[str, str]
    nodes: list[str]
    actor: str | None = None


class RunCompleted(WorkflowEvent):
    event_type: ClassVar[str] = RUN_COMPLETED


class RunFailed(WorkflowEvent):
    event_type: ClassVar[str] = RUN_FAILED
    node: str | None = None
    error: str | None = None


class RunCancelled(WorkflowEvent):
    event_type: ClassVar[str] = RUN_CANCELLED


class RunContinuedAsNew(WorkflowEvent):
    """The run ended by starting its successor (`NodeContext.continue_as_new`), recorded in the same
    transaction as the successor's RunStarted: the run is ended (status `continued`) with its link."""

    event_type: ClassVar[str] = RUN_CONTINUED_AS_NEW
    successor_run_id: str
    node: str


class RunTagged(WorkflowEvent):
    """Tags set on the run after its start (`NodeContext.set_tags`): each key gets its value, and a key
    whose value is None is removed. The run tables' tags are the fold of these (workflows.tags)."""

    event_type: ClassVar[str] = RUN_TAGGED
    tags: dict[str, str | None]
    #: The node that set them, if a node did.
    node: str | None = None
    actor: str | None = None


class RunPaused(WorkflowEvent):
    """The run starts no new node until it is resumed (`Engine.pause`). Its running nodes finish, or, with
    `interrupt_running`, stop at their next context call and are handed back, to go on from their
    checkpoints once the run is resumed."""

    event_type: ClassVar[str] = RUN_PAUSED
    actor: str | None = None
    interrupt_running: bool = False
    #: Set when the pause of this run's parent paused it (workflows.children).
    parent_run_id: str | None = None


class RunResumed(WorkflowEvent):
    """The paused run goes on where it was (`Engine.resume`): its ready nodes are claimable again."""

    event_type: ClassVar[str] = RUN_RESUMED
    actor: str | None = None
    #: Set when the resume of this run's parent resumed it (workflows.children).
    parent_run_id: str | None = None


class RunReleased(WorkflowEvent):
    """Retention let the ended run go (workflows.retention): its rows leave the run tables, in every
    replay and rebuild as well. Its stream stays (until its partitions are archived), so the run is still
    found by id and can be restored. It changes nothing in the run's folded state."""

    event_type: ClassVar[str] = RUN_RELEASED
    #: The retention that applied, in seconds, and who applied it (a retention pass: `retention:<id>`).
    retention_seconds: float
    actor: str | None = None


class RunRestored(WorkflowEvent):
    """A released run is back in the run tables, for inspection: its rows are folded again from its
    stream, equal to what they were. It changes nothing in the run's folded state."""

    event_type: ClassVar[str] = RUN_RESTORED
    actor: str | None = None


class KeyClaimed(WorkflowEvent):
    """In the key's stream: this run now holds the key."""

    event_type: ClassVar[str] = KEY_CLAIMED


class KeyReleased(WorkflowEvent):
    """In the key's stream: this run no longer holds the key."""

    event_type: ClassVar[str] = KEY_RELEASED


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

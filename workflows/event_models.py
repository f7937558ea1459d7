"""The payload models of the workflow events: one frozen pydantic model per event type, naming the fields
its payload carries (the type names are in `workflows.events`). Here: what every event carries, and the
events of the run and of its key; a node's events and the waits are in `workflows.node_event_models`."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from workflows.events import (
    KEY_CLAIMED,
    KEY_RELEASED,
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
)


class WorkflowEvent(BaseModel):
    """What every workflow event carries: the run it belongs to. Unknown payload fields are ignored when
    a recorded event is read (older or newer writers), but refused when one is built (`event()`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_type: ClassVar[str]
    run_id: uuid.UUID


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

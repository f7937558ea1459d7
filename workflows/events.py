"""The workflow event names and streams: every state change of a run is one of these types, in the run's
stream.

A run's stream is `wf-<run id>`; a key's stream `wfkey-<workflow>:<key>` records which run holds the
key, so that one key has at most one active run.

Each event type has a frozen pydantic model naming the fields its payload carries
(`workflows.event_models`, `workflows.node_event_models`); `workflows.event_codec` checks a new event
against it and reads a recorded one back as it.
"""

from __future__ import annotations

import re
import uuid

from eventstore import InvalidInputError

RUN_STARTED = "wf.RunStarted"
NODES_READY = "wf.NodesReady"
NODE_CLAIMED = "wf.NodeClaimed"
NODE_PROGRESS = "wf.NodeProgress"
NODE_CHECKPOINT = "wf.NodeCheckpoint"
STEP_RECORDED = "wf.StepRecorded"
CHILD_STARTED = "wf.ChildStarted"
NODE_SUCCEEDED = "wf.NodeSucceeded"
NODE_RETRY_SCHEDULED = "wf.NodeRetryScheduled"
NODE_FAILED = "wf.NodeFailed"
NODE_RECLAIMED = "wf.NodeReclaimed"
NODE_RELEASED = "wf.NodeReleased"
NODE_STUCK = "wf.NodeStuck"
NODE_PARKED = "wf.NodeParked"
NODE_CANCELLED = "wf.NodeCancelled"
RUN_CANCEL_REQUESTED = "wf.RunCancelRequested"
RUN_RETRIED = "wf.RunRetried"
RUN_REFRESHED = "wf.RunRefreshed"
RUN_COMPLETED = "wf.RunCompleted"
RUN_FAILED = "wf.RunFailed"
RUN_CANCELLED = "wf.RunCancelled"
RUN_CONTINUED_AS_NEW = "wf.RunContinuedAsNew"
RUN_PAUSED = "wf.RunPaused"
RUN_RESUMED = "wf.RunResumed"
NODE_WAITING = "wf.NodeWaiting"
SIGNAL_RECEIVED = "wf.SignalReceived"
SIGNAL_TAKEN = "wf.SignalTaken"
RUN_TAGGED = "wf.RunTagged"
RUN_RELEASED = "wf.RunReleased"
RUN_RESTORED = "wf.RunRestored"
KEY_CLAIMED = "wf.KeyClaimed"
KEY_RELEASED = "wf.KeyReleased"

RUN_CATEGORY = "wf"
KEY_CATEGORY = "wfkey"
#: Stream categories and the event-type prefix that only the engine writes: an event forged elsewhere
#: could break the workers of a run (which serve every tenant) or block the run tables for everyone.
RESERVED_CATEGORIES = frozenset({RUN_CATEGORY, KEY_CATEGORY})
RESERVED_TYPE_PREFIX = "wf."


class WorkflowEventError(InvalidInputError):
    """A workflow event whose type is unknown or whose fields do not match its type's model."""

    code = "invalid_workflow_event"


_SIGNAL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


def check_signal_name(name: object) -> str:
    """`name` if it can name a signal (both for sending one and for waiting for one), else a typed error."""
    if not isinstance(name, str) or not _SIGNAL_NAME.fullmatch(name):
        raise InvalidInputError(
            f"invalid signal name {name!r}: use 1 to 100 characters of letters, digits and _.:-"
        )
    return name


def run_stream(run_id: uuid.UUID) -> str:
    return f"wf-{run_id}"


def key_stream(workflow: str, key: str) -> str:
    return f"{KEY_CATEGORY}-{workflow}:{key}"

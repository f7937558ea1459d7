"""The workflow events: every state change of a run is one of these, in the run's stream.

A run's stream is `wf-<run id>`; a key's stream `wfkey-<workflow>:<key>` records which run holds the
key, so that one key has at most one active run.
"""

from __future__ import annotations

import uuid
from typing import Any

from eventstore import NewEvent

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
KEY_CLAIMED = "wf.KeyClaimed"
KEY_RELEASED = "wf.KeyReleased"

RUN_CATEGORY = "wf"


def run_stream(run_id: uuid.UUID) -> str:
    return f"wf-{run_id}"


def key_stream(workflow: str, key: str) -> str:
    return f"wfkey-{workflow}:{key}"


def event(event_type: str, run_id: uuid.UUID, **data: Any) -> NewEvent:
    """A workflow event; the run id also goes into the metadata as the correlation id."""
    return NewEvent(event_type, {"run_id": str(run_id), **data}, correlation_id=run_id)

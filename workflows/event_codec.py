"""Writing and reading workflow events against their models.

`event()` checks the fields against the type's model and writes them unchanged (the same JSON as ever, so
existing logs keep their meaning); `parse()` gives a recorded event back as its model, for the fold in
`workflows.run_fold`.
"""

from __future__ import annotations

import uuid
from typing import Any

import pydantic

from eventstore import NewEvent, RecordedEvent
from workflows.event_models import (
    KeyClaimed,
    KeyReleased,
    NodesReady,
    RunCancelled,
    RunCancelRequested,
    RunCompleted,
    RunContinuedAsNew,
    RunFailed,
    RunPaused,
    RunRefreshed,
    RunReleased,
    RunRestored,
    RunResumed,
    RunRetried,
    RunStarted,
    RunTagged,
    WorkflowEvent,
)
from workflows.events import WorkflowEventError
from workflows.node_event_models import (
    ChildStarted,
    NodeCancelled,
    NodeCheckpoint,
    NodeClaimed,
    NodeFailed,
    NodeParked,
    NodeProgress,
    NodeReclaimed,
    NodeReleased,
    NodeRetryScheduled,
    NodeStuck,
    NodeSucceeded,
    NodeWaiting,
    SignalReceived,
    SignalTaken,
    StepRecorded,
)

MODELS: dict[str, type[WorkflowEvent]] = {
    m.event_type: m
    for m in (
        RunStarted,
        NodesReady,
        NodeClaimed,
        NodeProgress,
        NodeCheckpoint,
        StepRecorded,
        ChildStarted,
        NodeSucceeded,
        NodeRetryScheduled,
        NodeFailed,
        NodeReclaimed,
        NodeReleased,
        NodeStuck,
        NodeParked,
        NodeCancelled,
        NodeWaiting,
        SignalReceived,
        SignalTaken,
        RunCancelRequested,
        RunRetried,
        RunRefreshed,
        RunCompleted,
        RunFailed,
        RunCancelled,
        RunContinuedAsNew,
        RunTagged,
        RunPaused,
        RunResumed,
        RunReleased,
        RunRestored,
        KeyClaimed,
        KeyReleased,
    )
}


def _model(event_type: str) -> type[WorkflowEvent]:
    model = MODELS.get(event_type)
    if model is None:
        raise WorkflowEventError(f"{event_type!r} is not a workflow event type")
    return model


def event(event_type: str, run_id: uuid.UUID, **data: Any) -> NewEvent:
    """A workflow event; the run id also goes into the metadata as the correlation id.

    The fields are checked strictly against the type's model (no coercion: what is checked is what is
    written), then written as given."""
    model = _model(event_type)
    unknown = data.keys() - model.model_fields.keys()
    if unknown:
        raise WorkflowEventError(f"{event_type} has no field(s) {sorted(unknown)}")
    try:
        model.model_validate({"run_id": run_id, **data}, strict=True)
    except pydantic.ValidationError as error:
        raise WorkflowEventError(f"{event_type}: {error}") from error
    return NewEvent(event_type, {"run_id": str(run_id), **data}, correlation_id=run_id)


def is_workflow_event(e: RecordedEvent) -> bool:
    return e.type in MODELS


def parse(e: RecordedEvent) -> WorkflowEvent:
    """A recorded workflow event as its model. Raises WorkflowEventError for another type or a payload
    that does not fit its type."""
    model = _model(e.type)
    try:
        return model.model_validate(e.data)
    except pydantic.ValidationError as error:
        raise WorkflowEventError(
            f"event {e.event_id} ({e.type}) at {e.stream_id}@{e.stream_version} does not fit its model: "
            f"{error}"
        ) from error

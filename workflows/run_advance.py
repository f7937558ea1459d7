"""A run's holder applying its own appends to its copy of the run, as the log now holds them, so that it
never reads back what it wrote (a node's context, a node's end)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from eventstore import AppendResult, NewEvent, RecordedEvent
from eventstore.spi import json_dumps, json_loads
from workflows import events as ev
from workflows.run_fold import apply
from workflows.run_state import RunState


@dataclass(frozen=True)
class WrittenJson:
    """The JSON texts an append sent for its events' data and metadata, in the events' order."""

    data: Sequence[str]
    metadata: Sequence[str]


def advance(
    run: RunState,
    events: Sequence[NewEvent],
    result: AppendResult,
    recorded_at: datetime,
    written: WrittenJson | None = None,
) -> bool:
    """Apply to `run`, in place, the `events` its holder just appended to the run's stream, as the log
    now holds them (`result`: where they landed; `recorded_at`: their transaction's timestamp), so that the
    holder never reads back what it wrote. Only when they directly follow the version `run` knows: True
    then; otherwise `run` is left as it was, and `Engine.catch_up` brings it up to date when needed.
    `written`: the JSON texts of the events' data and metadata as the append sent them, in order, so that
    they are not serialised a second time."""
    stream = ev.run_stream(run.run_id)
    landed = [a for a in result.events if a.stream_id == stream]
    if len(landed) != len(events) or not landed or landed[0].stream_version != run.version + 1:
        return False
    if written is None:
        written = WrittenJson(
            [json_dumps(dict(e.data)) for e in events],
            [json_dumps(dict(e.metadata)) for e in events],
        )
    for pending, at, data, metadata in zip(events, landed, written.data, written.metadata, strict=True):
        apply(
            run,
            RecordedEvent(
                at.position,
                at.transaction_id,
                run.tenant,
                stream,
                at.stream_version,
                pending.event_id,
                pending.type,
                # As a reader would get it back: JSON values, not the Python objects that were written.
                json_loads(data),
                json_loads(metadata),
                pending.correlation_id,
                pending.causation_id,
                recorded_at,
            ),
        )
    return True

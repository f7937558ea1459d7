"""What a node's end answers (`workflows.queue_node_ends`): its outcome, and the rows its statements
return, one shape per statement. Apart because the rows of a run's end carry four kinds in one shape.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eventstore.spi import EventRow
from workflows.queue_claims import AppendedRows, Claim


@dataclass(frozen=True)
class NodeEnded:
    #: Crashes counted so far for the claimed successor (0 for a node queued for the first time).
    successor_crashes: int
    #: The transaction's timestamp: the recorded_at of events appended with the change.
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class NodeEndRow:
    """A row of record_node_end: the end's outcome (the same on every row) and one appended event's row."""

    crashes: int
    recorded_at: datetime
    stream_id: str
    stream_version: int
    position: int
    transaction_id: int

    @property
    def appended(self) -> tuple[Any, ...]:
        """In the columns `EventStore.appended` takes."""
        return (self.stream_id, self.stream_version, self.position, self.transaction_id)


@dataclass(frozen=True)
class RunEnded:
    """What `record_run_end` did: the end's outcome and the rows of its appended events, the claim of a
    node of another run (if one was ready) with the row of its NodeClaimed, and that run's snapshot, if it
    has one (its version and JSON: `workflows.snapshots.from_json`), with the events after it as a stream
    read gives them (`EventStore.recorded` turns them into events; signals without their payloads)."""

    outcome: NodeEnded
    appended: list[tuple[Any, ...]]
    claims: list[Claim]
    claims_appended: AppendedRows
    next_run_events: list[EventRow]
    next_run_snapshot: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class RunEndRow:
    """A row of record_run_end (see ledgerflow.wf_record_run_end), one of four kinds (see `kind`)."""

    crashes: int | None
    recorded_at: datetime | None
    stream_id: str | None
    stream_version: int | None
    position: int | None
    transaction_id: int | None
    run_id: uuid.UUID | None
    node: str | None
    tenant: str | None
    workflow: str | None
    attempt: int | None
    token: int | None
    cancel_requested: bool | None
    claim_crashes: int | None
    version: str | None
    event_id: uuid.UUID | None
    event_type: str | None
    data: str | None
    metadata: str | None
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    event_recorded_at: datetime | None

    @property
    def kind(self) -> str:
        """ "appended": an event the end appended (with the end's outcome); "claimed": the claim of a node
        of another run (with its NodeClaimed event's row); "snapshot": that run's snapshot (its version,
        its JSON in `data`); "event": one of that run's events after the snapshot."""
        if self.run_id is None:
            return "appended"
        if self.event_id is not None:
            return "event"
        return "claimed" if self.node is not None else "snapshot"

    @property
    def appended(self) -> tuple[Any, ...]:
        """In the columns `EventStore.appended` takes."""
        return (self.stream_id, self.stream_version, self.position, self.transaction_id)

    @property
    def outcome(self) -> NodeEnded:
        """An "appended" row's outcome of the end, which every such row carries."""
        return NodeEnded(self.crashes, self.recorded_at)  # type: ignore[arg-type]

    @property
    def snapshot(self) -> tuple[int, str]:
        """A "snapshot" row's snapshot: its version and its JSON."""
        return self.stream_version, self.data  # type: ignore[return-value]

    @property
    def claim(self) -> Claim:
        """A "claimed" row's claim: every column of a claim is set on such a row."""
        return Claim(
            self.run_id,  # type: ignore[arg-type]
            self.node,  # type: ignore[arg-type]
            self.tenant,  # type: ignore[arg-type]
            self.workflow,  # type: ignore[arg-type]
            self.attempt,  # type: ignore[arg-type]
            self.token,  # type: ignore[arg-type]
            self.cancel_requested,  # type: ignore[arg-type]
            self.claim_crashes,  # type: ignore[arg-type]
            self.version,  # type: ignore[arg-type]
        )

    @property
    def event(self) -> EventRow:
        """An "event" row's event, as a stream read gives it (`EventStore.recorded` takes it): every column
        of an event is set on such a row."""
        row: Any = self
        return EventRow(
            0,
            row.position,
            row.transaction_id,
            row.tenant,
            row.stream_id,
            row.stream_version,
            row.event_id,
            row.event_type,
            row.data,
            row.metadata,
            row.correlation_id,
            row.causation_id,
            row.event_recorded_at,
        )

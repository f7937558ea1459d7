"""The event envelope: what producers append and what readers get back, as frozen value types."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import total_ordering
from typing import Any

import pydantic

JsonObject = dict[str, Any]


class ExpectedState(enum.Enum):
    """What an append expects of a stream, when it does not name an exact version."""

    ANY = -1
    NO_STREAM = -2
    STREAM_EXISTS = -3


#: Either an exact version (the stream's last event has this version; versions start at 1) or a state.
ExpectedVersion = int | ExpectedState

ANY = ExpectedState.ANY
NO_STREAM = ExpectedState.NO_STREAM
STREAM_EXISTS = ExpectedState.STREAM_EXISTS


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. `event_id` defaults to a fresh UUID; it is unique within the tenant's log."""

    type: str
    data: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)
    correlation_id: uuid.UUID | None = None
    causation_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """One stream's share of an append that may touch several streams atomically."""

    stream_id: str
    #: NewEvents, or instances of declared event models (see `eventstore.eventtypes`).
    events: Sequence[NewEvent | pydantic.BaseModel]
    expected_version: ExpectedVersion = ExpectedState.ANY


@total_ordering
@dataclass(frozen=True, slots=True)
class Cursor:
    """A place in the global log, in its resume order: (writing transaction id, position).

    Never compare positions alone: a later position can commit earlier than a smaller one.
    """

    transaction_id: int = 0
    position: int = 0

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Cursor):
            return NotImplemented
        return (self.transaction_id, self.position) < (other.transaction_id, other.position)

    def __str__(self) -> str:
        return f"{self.transaction_id}:{self.position}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Parse the `transaction_id:position` form that `str()` produces."""
        from eventstore.errors import InvalidInputError

        try:
            tx, pos = text.split(":")
            cursor = cls(int(tx), int(pos))
        except ValueError:
            raise InvalidInputError(
                f"{text!r} is not a cursor; cursors look like '<transaction_id>:<position>', e.g. '0:0'"
            ) from None
        if cursor.transaction_id < 0 or cursor.position < 0:
            raise InvalidInputError(f"cursor {text!r} has a negative part")
        return cursor


START = Cursor(0, 0)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored in the log."""

    position: int
    transaction_id: int
    tenant: str
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    type: str
    data: JsonObject
    metadata: JsonObject
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    recorded_at: datetime

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.transaction_id, self.position)

    @property
    def category(self) -> str:
        return self.stream_id.split("-", 1)[0]


@dataclass(frozen=True, slots=True)
class AppendedEvent:
    stream_id: str
    stream_version: int
    position: int
    transaction_id: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append's events landed. `duplicate` is true when an idempotency key matched an earlier
    append with the same content: these are that append's results, and nothing new was written."""

    events: tuple[AppendedEvent, ...]
    duplicate: bool

    @property
    def versions(self) -> dict[str, int]:
        """The version each touched stream reached."""
        return {e.stream_id: e.stream_version for e in self.events}

    @property
    def last_position(self) -> int:
        return max(e.position for e in self.events)


@dataclass(frozen=True, slots=True)
class ReadPage:
    """A page of the global log. Resume from `cursor`; it may lie beyond the last event when the reader
    has read everything that is safe to read (`caught_up`). A page that stopped at its count or byte
    limit is never `caught_up`, and its cursor is its last event's."""

    events: tuple[RecordedEvent, ...]
    cursor: Cursor
    caught_up: bool


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """An event as stored, its data and metadata still JSON text as PostgreSQL wrote it: for passing
    events on (an HTTP answer) without building Python objects of them. `decode()` gives the RecordedEvent."""

    position: int
    transaction_id: int
    tenant: str
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    type: str
    data_json: str
    metadata_json: str
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    recorded_at: datetime

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.transaction_id, self.position)

    def decode(self) -> RecordedEvent:
        from eventstore.jsonvalue import loads

        return RecordedEvent(
            self.position,
            self.transaction_id,
            self.tenant,
            self.stream_id,
            self.stream_version,
            self.event_id,
            self.type,
            loads(self.data_json),
            loads(self.metadata_json),
            self.correlation_id,
            self.causation_id,
            self.recorded_at,
        )


@dataclass(frozen=True, slots=True)
class EncodedPage:
    """A page of the global log with its events still encoded; see `ReadPage`."""

    events: tuple[EncodedEvent, ...]
    cursor: Cursor
    caught_up: bool


@dataclass(frozen=True, slots=True)
class StreamPage:
    """A page of one stream, its events still encoded. `next_version` is where the next page starts (pass it
    as `from_version`); None when the page reached the stream's end in its direction."""

    events: tuple[EncodedEvent, ...]
    next_version: int | None

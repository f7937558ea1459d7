"""The event store: an append-only PostgreSQL log with optimistic concurrency, idempotent appends and
gap-free reading."""

from eventstore.connect import open_store
from eventstore.errors import (
    ConflictError,
    DatabaseUnavailableError,
    EventTooLargeError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    WrongExpectedVersionError,
)
from eventstore.events import (
    ANY,
    NO_STREAM,
    START,
    STREAM_EXISTS,
    AppendResult,
    Cursor,
    EncodedEvent,
    EncodedPage,
    ExpectedState,
    NewEvent,
    ReadPage,
    RecordedEvent,
    StreamAppend,
    StreamPage,
)
from eventstore.eventtypes import EventTypes
from eventstore.settings import DatabaseSettings
from eventstore.store import EventStore, Horizon
from eventstore.subscribe import Subscription

__ledgerflow_package__ = True

__all__ = [
    "ANY",
    "NO_STREAM",
    "START",
    "STREAM_EXISTS",
    "AppendResult",
    "ConflictError",
    "Cursor",
    "DatabaseSettings",
    "DatabaseUnavailableError",
    "EncodedEvent",
    "EncodedPage",
    "EventStore",
    "EventTooLargeError",
    "EventTypes",
    "ExpectedState",
    "Horizon",
    "IdempotencyConflictError",
    "InvalidInputError",
    "LedgerflowError",
    "NewEvent",
    "ReadPage",
    "RecordedEvent",
    "StreamAppend",
    "StreamPage",
    "Subscription",
    "WrongExpectedVersionError",
    "open_store",
]

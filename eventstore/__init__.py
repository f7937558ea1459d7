"""The event store: an append-only PostgreSQL log with optimistic concurrency, idempotent appends and
gap-free reading."""

from eventstore._validation import (
    EVENT_TYPE_PATTERN,
    IDEMPOTENCY_KEY_PATTERN,
    check_stream_id,
    check_tenant,
)
from eventstore.connect import open_store
from eventstore.db import redact, resolve_database_url
from eventstore.errors import (
    ArchiveRefusedError,
    ConfigurationError,
    ConflictError,
    DatabaseUnavailableError,
    EventTooLargeError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    MigrationError,
    MissingRelationError,
    NotFoundError,
    QuotaExceededError,
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
    ExpectedVersion,
    NewEvent,
    ReadPage,
    RecordedEvent,
    StreamAppend,
    StreamPage,
)
from eventstore.eventtypes import EventTypes
from eventstore.migrate import Migration, applied_versions, pending_migrations
from eventstore.migrate import migrate as apply_migrations
from eventstore.partitions import (
    LogEnd,
    Manifest,
    Partition,
    archive_partition,
    ensure_partitions,
    list_partitions,
    restore_partition,
)
from eventstore.settings import DatabaseSettings
from eventstore.store import EventStore, Horizon
from eventstore.subscribe import Subscription

__ledgerflow_package__ = True

__all__ = [
    "ANY",
    "EVENT_TYPE_PATTERN",
    "IDEMPOTENCY_KEY_PATTERN",
    "NO_STREAM",
    "START",
    "STREAM_EXISTS",
    "AppendResult",
    "ArchiveRefusedError",
    "ConfigurationError",
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
    "ExpectedVersion",
    "Horizon",
    "IdempotencyConflictError",
    "InvalidInputError",
    "LedgerflowError",
    "LogEnd",
    "Manifest",
    "Migration",
    "MigrationError",
    "MissingRelationError",
    "NewEvent",
    "NotFoundError",
    "Partition",
    "QuotaExceededError",
    "ReadPage",
    "RecordedEvent",
    "StreamAppend",
    "StreamPage",
    "Subscription",
    "WrongExpectedVersionError",
    "applied_versions",
    "apply_migrations",
    "archive_partition",
    "check_stream_id",
    "check_tenant",
    "ensure_partitions",
    "list_partitions",
    "open_store",
    "pending_migrations",
    "redact",
    "resolve_database_url",
    "restore_partition",
]

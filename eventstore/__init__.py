"""The event store: an append-only PostgreSQL log with optimistic concurrency, idempotent appends and
gap-free reading."""

from eventstore._guard import require_ledgerflow_packages
from eventstore._validation import (
    EVENT_TYPE_PATTERN,
    IDEMPOTENCY_KEY_PATTERN,
    check_stream_id,
    check_tenant,
)
from eventstore.connect import open_store
from eventstore.db import connect as open_connection
from eventstore.db import pipelined, redact, resolve_database_url, synced, translate, wrap_exceptions
from eventstore.errors import (
    ArchiveRefusedError,
    ConfigurationError,
    ConflictError,
    DatabaseUnavailableError,
    EventTooLargeError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    MasterKeyMissingError,
    MasterKeyUnknownError,
    MigrationError,
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
from eventstore.jsonvalue import dumps as json_dumps
from eventstore.jsonvalue import loads as json_loads
from eventstore.keys import Forgotten, RotationProgress
from eventstore.masterkeys import MasterKeys, generate_master_key
from eventstore.migrate import Migration, applied_versions, pending_migrations
from eventstore.migrate import migrate as apply_migrations
from eventstore.outage import Outage, OutageState, backoff, is_unavailable, sleeper
from eventstore.partitions import (
    LogEnd,
    Manifest,
    Partition,
    archive_partition,
    ensure_partitions,
    list_partitions,
    restore_partition,
)
from eventstore.personal import REDACTED, Personal, personal_fields
from eventstore.settings import DatabaseSettings
from eventstore.sqlfile import load_queries
from eventstore.store import EventStore, Horizon
from eventstore.subjects import FORGOTTEN_STREAM, forget_subject, rotate_master_key
from eventstore.subscribe import Subscription

__ledgerflow_package__ = True

__all__ = [
    "ANY",
    "EVENT_TYPE_PATTERN",
    "FORGOTTEN_STREAM",
    "IDEMPOTENCY_KEY_PATTERN",
    "NO_STREAM",
    "REDACTED",
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
    "Forgotten",
    "Horizon",
    "IdempotencyConflictError",
    "InvalidInputError",
    "LedgerflowError",
    "LogEnd",
    "Manifest",
    "MasterKeyMissingError",
    "MasterKeyUnknownError",
    "MasterKeys",
    "Migration",
    "MigrationError",
    "NewEvent",
    "NotFoundError",
    "Outage",
    "OutageState",
    "Partition",
    "Personal",
    "QuotaExceededError",
    "ReadPage",
    "RecordedEvent",
    "RotationProgress",
    "StreamAppend",
    "StreamPage",
    "Subscription",
    "WrongExpectedVersionError",
    "applied_versions",
    "apply_migrations",
    "archive_partition",
    "backoff",
    "check_stream_id",
    "check_tenant",
    "ensure_partitions",
    "forget_subject",
    "generate_master_key",
    "is_unavailable",
    "json_dumps",
    "json_loads",
    "list_partitions",
    "load_queries",
    "open_connection",
    "open_store",
    "pending_migrations",
    "personal_fields",
    "pipelined",
    "redact",
    "require_ledgerflow_packages",
    "resolve_database_url",
    "restore_partition",
    "rotate_master_key",
    "sleeper",
    "synced",
    "translate",
    "wrap_exceptions",
]

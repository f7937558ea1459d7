"""The event store: an append-only PostgreSQL log with optimistic concurrency, idempotent appends and
gap-free reading."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
        EventTypeRegistryError,
        IdempotencyConflictError,
        InvalidInputError,
        LedgerflowError,
        MasterKeyMissingError,
        MasterKeyUnknownError,
        MigrationError,
        MissingRelationError,
        NotFoundError,
        QuotaExceededError,
        UpcastError,
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
    from eventstore.eventtypes import DEFAULT_TYPES, EventTypes, TypeDeclaration, event_type, upcaster
    from eventstore.keys import Forgotten, RotationProgress
    from eventstore.masterkeys import MasterKeys, generate_master_key
    from eventstore.migrate import Migration, applied_versions, pending_migrations, shipped_migrations
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
    from eventstore.personal import REDACTED, Personal, personal_fields
    from eventstore.settings import DatabaseSettings
    from eventstore.store import EventStore, Horizon
    from eventstore.subjects import FORGOTTEN_STREAM, forget_subject, rotate_master_key
    from eventstore.subscribe import Subscription
    from eventstore.upcasting import UPCAST_FROM_KEY, VERSION_KEY, Upcaster
else:
    from eventstore._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "eventstore._validation": (
                "EVENT_TYPE_PATTERN",
                "IDEMPOTENCY_KEY_PATTERN",
                "check_stream_id",
                "check_tenant",
            ),
            "eventstore.connect": ("open_store",),
            "eventstore.db": (
                "redact",
                "resolve_database_url",
            ),
            "eventstore.errors": (
                "ArchiveRefusedError",
                "ConfigurationError",
                "ConflictError",
                "DatabaseUnavailableError",
                "EventTooLargeError",
                "EventTypeRegistryError",
                "IdempotencyConflictError",
                "InvalidInputError",
                "LedgerflowError",
                "MasterKeyMissingError",
                "MasterKeyUnknownError",
                "MigrationError",
                "MissingRelationError",
                "NotFoundError",
                "QuotaExceededError",
                "UpcastError",
                "WrongExpectedVersionError",
            ),
            "eventstore.events": (
                "ANY",
                "NO_STREAM",
                "START",
                "STREAM_EXISTS",
                "AppendResult",
                "Cursor",
                "EncodedEvent",
                "EncodedPage",
                "ExpectedState",
                "ExpectedVersion",
                "NewEvent",
                "ReadPage",
                "RecordedEvent",
                "StreamAppend",
                "StreamPage",
            ),
            "eventstore.eventtypes": (
                "DEFAULT_TYPES",
                "EventTypes",
                "TypeDeclaration",
                "event_type",
                "upcaster",
            ),
            "eventstore.keys": (
                "Forgotten",
                "RotationProgress",
            ),
            "eventstore.masterkeys": (
                "MasterKeys",
                "generate_master_key",
            ),
            "eventstore.migrate": (
                "Migration",
                "applied_versions",
                "pending_migrations",
                "shipped_migrations",
                "apply_migrations=migrate",
            ),
            "eventstore.partitions": (
                "LogEnd",
                "Manifest",
                "Partition",
                "archive_partition",
                "ensure_partitions",
                "list_partitions",
                "restore_partition",
            ),
            "eventstore.personal": (
                "REDACTED",
                "Personal",
                "personal_fields",
            ),
            "eventstore.settings": ("DatabaseSettings",),
            "eventstore.store": (
                "EventStore",
                "Horizon",
            ),
            "eventstore.subjects": (
                "FORGOTTEN_STREAM",
                "forget_subject",
                "rotate_master_key",
            ),
            "eventstore.subscribe": ("Subscription",),
            "eventstore.upcasting": (
                "UPCAST_FROM_KEY",
                "VERSION_KEY",
                "Upcaster",
            ),
        },
    )

__ledgerflow_package__ = True

__all__ = [
    "ANY",
    "DEFAULT_TYPES",
    "EVENT_TYPE_PATTERN",
    "FORGOTTEN_STREAM",
    "IDEMPOTENCY_KEY_PATTERN",
    "NO_STREAM",
    "REDACTED",
    "START",
    "STREAM_EXISTS",
    "UPCAST_FROM_KEY",
    "VERSION_KEY",
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
    "EventTypeRegistryError",
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
    "MissingRelationError",
    "NewEvent",
    "NotFoundError",
    "Partition",
    "Personal",
    "QuotaExceededError",
    "ReadPage",
    "RecordedEvent",
    "RotationProgress",
    "StreamAppend",
    "StreamPage",
    "Subscription",
    "TypeDeclaration",
    "UpcastError",
    "Upcaster",
    "WrongExpectedVersionError",
    "applied_versions",
    "apply_migrations",
    "archive_partition",
    "check_stream_id",
    "check_tenant",
    "ensure_partitions",
    "event_type",
    "forget_subject",
    "generate_master_key",
    "list_partitions",
    "open_store",
    "pending_migrations",
    "personal_fields",
    "redact",
    "resolve_database_url",
    "restore_partition",
    "rotate_master_key",
    "shipped_migrations",
    "upcaster",
]

"""The typed errors of ledgerflow.

Every error raised on purpose derives from `LedgerflowError`. Driver errors are translated once, by
`eventstore.db.wrap_exceptions` in the modules that run SQL, so callers never catch psycopg exceptions.
Errors also subclass the fitting builtin (`ValueError` for bad input, `ConnectionError` for an unreachable
database) so generic handlers work. Each message says what happened and, where there is one, what to do next.
"""

from __future__ import annotations

from typing import Any, Literal


class LedgerflowError(Exception):
    """Base of every error ledgerflow raises on purpose."""

    #: A stable, machine-readable code (used by the HTTP API and `--json` output).
    code: str = "ledgerflow_error"

    def details(self) -> dict[str, Any]:
        """Structured facts about the error, safe to show to the caller."""
        return {}


class ConfigurationError(LedgerflowError):
    code = "configuration_error"


#: Why a connection to PostgreSQL failed, as far as the driver's report tells (`eventstore.refusals`):
#: the server refused it for good (no such database, a refused login, a login the server's rules do not
#: permit, a setting libpq rejects), or it could not be had for now (the server cannot be reached, has no
#: free connection slot, or is stopping, restarting or recovering), or something else.
ConnectFailure = Literal[
    "no_database",
    "login_refused",
    "not_permitted",
    "bad_setting",
    "unreachable",
    "no_free_slot",
    "restarting",
    "other",
]


class DatabaseUnavailableError(LedgerflowError, ConnectionError):
    """The database cannot be used now: retry once it answers. Translated from a driver error, it says
    why, as data: `reason` (the driver's own words, one line) and `failure` (what kind of failure)."""

    code = "database_unavailable"

    def __init__(self, message: str, *, reason: str | None = None, failure: ConnectFailure = "other") -> None:
        super().__init__(message)
        self.reason = reason
        self.failure: ConnectFailure = failure


class DatabaseRefusedError(DatabaseUnavailableError):
    """The server answered and refused the connection: no such database (`database` names it), a refused
    login, a login its rules do not permit, a connection setting libpq rejects. No wait fixes that unless
    someone changes the set-up, so a process starting up stops at once on it. Still a
    DatabaseUnavailableError: a running worker whose database is dropped or whose password is changed
    waits for the fix as it waits out an outage."""

    def __init__(
        self, message: str, *, reason: str, failure: ConnectFailure, database: str | None = None
    ) -> None:
        super().__init__(message, reason=reason, failure=failure)
        self.database = database


class MisconfiguredDatabaseError(ConfigurationError):
    """The database set-up is wrong in a way no wait will fix (a malformed URL, a refused connection):
    `what` went wrong and what to do about it (`todo`)."""

    code = "database_misconfigured"

    def __init__(self, what: str, todo: str) -> None:
        super().__init__(f"{what}; {todo}")
        self.what, self.todo = what, todo


class MigrationError(LedgerflowError):
    code = "migration_error"


class InvalidInputError(LedgerflowError, ValueError):
    """The caller sent something the store refuses; nothing was written."""

    code = "invalid_input"


class EventTooLargeError(InvalidInputError):
    code = "event_too_large"


class EventDecodeError(LedgerflowError):
    """A stored event no longer matches the model declared for its type."""

    code = "event_decode_error"


class ConflictError(LedgerflowError):
    """The request is valid but conflicts with what is already recorded; nothing was written."""

    code = "conflict"


class WrongExpectedVersionError(ConflictError):
    code = "wrong_expected_version"

    def __init__(self, tenant: str, stream_id: str, expected: str, actual: int | None) -> None:
        self.tenant = tenant
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        shown = "no stream" if actual is None else f"version {actual}"
        super().__init__(
            f"stream {stream_id!r} (tenant {tenant!r}) is at {shown}, but the append expected {expected}; "
            "nothing was written. Re-read the stream, decide again, and append with the new version."
        )

    def details(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id, "expected": self.expected, "actual": self.actual}


class IdempotencyConflictError(ConflictError):
    code = "idempotency_conflict"

    def __init__(self, tenant: str, key: str) -> None:
        self.tenant = tenant
        self.key = key
        super().__init__(
            f"idempotency key {key!r} (tenant {tenant!r}) was already used for a different request; "
            "nothing was written. Use a new key for new content."
        )

    def details(self) -> dict[str, Any]:
        return {"idempotency_key": self.key}


class DuplicateEventIdError(ConflictError):
    code = "duplicate_event_id"

    def __init__(self, message: str) -> None:
        super().__init__(
            f"{message}; nothing was written. Event ids are unique within a tenant's log: "
            "to retry an append safely, use an idempotency key."
        )


class MissingRelationError(LedgerflowError):
    """A table the query needs does not exist (yet): e.g. a projection's tables before its first run."""

    code = "missing_relation"


class NotFoundError(LedgerflowError, LookupError):
    code = "not_found"


class ArchiveRefusedError(LedgerflowError):
    """A partition of the log cannot be archived or restored now; the message says why and what to do."""

    code = "archive_refused"


class QuotaExceededError(LedgerflowError):
    """A tenant is over one of its quotas (runs in flight, starts or appends per second); nothing was
    written. `retry_after`: seconds after which the same request may be admitted."""

    code = "quota_exceeded"

    def __init__(self, tenant: str, quota: str, limit: float, retry_after: float, source: str) -> None:
        self.tenant = tenant
        self.quota = quota
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(
            f"tenant {tenant!r} is over its quota of {limit:g} {quota.replace('_', ' ')} ({source}); "
            f"nothing was written. Retry after {retry_after:.2f} s."
        )

    def details(self) -> dict[str, Any]:
        return {"quota": self.quota, "limit": self.limit, "retry_after": round(self.retry_after, 3)}


class EventTypeRegistryError(InvalidInputError):
    """The declared event types and upcasters do not fit together (a missing step in a chain, a version
    declared twice): found when they are checked, before any event is read with them."""

    code = "event_type_registry_error"


class UpcastError(LedgerflowError):
    """A stored event could not be brought to its type's latest shape: an upcaster failed, or its result
    does not fit the latest model. The stored event is unchanged."""

    code = "upcast_failed"

    def __init__(
        self,
        *,
        event_id: object,
        position: int,
        event_type: str,
        version: int,
        step: tuple[int, int] | None,
        reason: str,
    ) -> None:
        self.event_id = event_id
        self.position = position
        self.event_type = event_type
        self.version = version
        self.step = step
        where = f"upcaster {step[0]}->{step[1]}" if step else "the latest model"
        super().__init__(
            f"event {event_id} at position {position} ({event_type!r}, stored at version {version}) "
            f"could not be upcast: {where} failed: {reason}. The stored event is unchanged; fix the "
            "upcaster (or read with upcasting off) and read again."
        )

    def details(self) -> dict[str, Any]:
        return {
            "event_id": str(self.event_id),
            "position": self.position,
            "event_type": self.event_type,
            "version": self.version,
            "step": list(self.step) if self.step else None,
        }


class MasterKeyMissingError(ConfigurationError):
    """Personal fields are to be encrypted or decrypted, and no master key is configured."""

    code = "master_key_missing"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}, but no master key is configured: set LEDGERFLOW_MASTER_KEY (the base64 of 32 random "
            "bytes; `ledgerflow keys generate` prints one) or LEDGERFLOW_MASTER_KEY_FILE (a file holding it)"
        )


class MasterKeyUnknownError(ConfigurationError):
    """A data key is wrapped by a master key that is not configured (neither current nor previous)."""

    code = "master_key_unknown"

    def __init__(self, master_key_id: str) -> None:
        self.master_key_id = master_key_id
        super().__init__(
            f"a subject's data key is wrapped by master key {master_key_id}, which is not configured: set "
            "it as LEDGERFLOW_MASTER_KEY, or list it in LEDGERFLOW_PREVIOUS_MASTER_KEYS until "
            "`ledgerflow keys rotate-master` has re-wrapped every data key"
        )

    def details(self) -> dict[str, Any]:
        return {"master_key_id": self.master_key_id}

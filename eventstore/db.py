"""Connections: resolving the database, the connection pool, and translating driver errors once.

Driver exceptions never leave this package untranslated: `translate_errors()` turns them into the
`LedgerflowError` tree, keeping the original as `__cause__`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors
import psycopg_pool
import structlog

from eventstore.errors import (
    DatabaseUnavailableError,
    DuplicateEventIdError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    WrongExpectedVersionError,
)
from eventstore.settings import DatabaseSettings

log = structlog.get_logger(__name__)

# SQLSTATEs raised on purpose by ledgerflow's own SQL (see migrations/).
WRONG_EXPECTED_VERSION = "LF001"
IDEMPOTENCY_CONFLICT = "LF002"
APPEND_ONLY = "LF003"


def resolve_database_url(settings: DatabaseSettings) -> str:
    """The configured URL, or the URL of the embedded PostgreSQL, started if need be."""
    if settings.database_url:
        return settings.database_url
    from eventstore.embedded import start_embedded

    return start_embedded(settings.embedded_data_dir)


def open_pool(
    url: str, settings: DatabaseSettings, *, name: str = "ledgerflow"
) -> psycopg_pool.ConnectionPool:
    """An open pool of autocommit connections; fails with a clear error if the database does not answer."""
    idle_ms = int(settings.idle_in_transaction_timeout * 1000)
    pool = psycopg_pool.ConnectionPool(
        url,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        kwargs={
            "autocommit": True,
            "application_name": name,
            "options": f"-c idle_in_transaction_session_timeout={idle_ms}",
        },
        name=name,
        open=False,
    )
    try:
        pool.open(wait=True, timeout=settings.connect_timeout)
    except psycopg_pool.PoolTimeout as exc:
        pool.close()
        raise DatabaseUnavailableError(
            f"could not connect to PostgreSQL at {redact(url)} within {settings.connect_timeout:g}s; "
            "check that the server runs and LEDGERFLOW_DATABASE_URL is right"
        ) from exc
    return pool


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **info)


def _detail(exc: psycopg.Error) -> dict[str, Any]:
    raw = exc.diag.message_detail or "{}"
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def translate(exc: psycopg.Error) -> LedgerflowError:
    """The ledgerflow error for a driver error."""
    state = exc.sqlstate
    if state == WRONG_EXPECTED_VERSION:
        d = _detail(exc)
        expected = int(d.get("expected", 0))
        shown = {-1: "any", -2: "no stream", -3: "stream exists"}.get(expected, f"version {expected}")
        return WrongExpectedVersionError(
            str(d.get("tenant")), str(d.get("stream_id")), shown, d.get("actual")
        )
    if state == IDEMPOTENCY_CONFLICT:
        d = _detail(exc)
        return IdempotencyConflictError(str(d.get("tenant")), str(d.get("key")))
    if (
        isinstance(exc, psycopg.errors.UniqueViolation)
        and exc.diag.constraint_name == "events_event_id_unique"
    ):
        return DuplicateEventIdError(exc.diag.message_detail or "an event id is already in the log")
    if isinstance(exc, psycopg.errors.DataError | psycopg.errors.IntegrityConstraintViolation):
        return InvalidInputError(f"the database refused the input: {exc.diag.message_primary}")
    if state == APPEND_ONLY:
        return InvalidInputError(str(exc.diag.message_primary))
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailableError(
            f"the database connection failed: {exc}; retry once PostgreSQL answers"
        )
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return DatabaseUnavailableError(f"no database connection became free in time: {exc}")
    return LedgerflowError(f"unexpected database error ({state}): {exc}")


@contextmanager
def translate_errors() -> Iterator[None]:
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc
    except psycopg_pool.PoolTimeout as exc:
        raise DatabaseUnavailableError(f"no database connection became free in time: {exc}") from exc

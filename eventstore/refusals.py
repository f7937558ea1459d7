"""A database set-up that cannot work, told apart from an outage, here at the driver's side.

A malformed LEDGERFLOW_DATABASE_URL is found before any connection (`check_database_url`). A failed
connection is read once, where driver errors are translated (`eventstore.db.translate`): the server that
answered and refused it (no such database, a refused login) gives a `DatabaseRefusedError`, anything else a
`DatabaseUnavailableError`; both carry the driver's reason in one line and the kind of failure, so that the
layers above advise on it without reading the driver's text or knowing its types.
"""

from __future__ import annotations

import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

from eventstore.errors import (
    ConnectFailure,
    DatabaseRefusedError,
    DatabaseUnavailableError,
    MisconfiguredDatabaseError,
)

_SCHEMES = ("postgresql", "postgres")
URL_FORM = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (or key=value settings: host=... dbname=...)"

#: (pattern in the driver's message, the kind of failure it tells), the first match winning. A failed
#: connection carries no SQLSTATE (libpq reports the server's FATAL as text), so its text is all there is.
_KINDS: list[tuple[re.Pattern[str], ConnectFailure]] = [
    (re.compile(r"database \"(?P<database>[^\"]+)\" does not exist"), "no_database"),
    (
        re.compile(r"password authentication failed|role \"[^\"]+\" does not exist|no password supplied"),
        "login_refused",
    ),
    (re.compile(r"no pg_hba\.conf entry"), "not_permitted"),
    (re.compile(r"invalid connection option|invalid (?:integer )?value"), "bad_setting"),
    (
        re.compile(
            r"Connection refused|could not translate host name|failed to resolve host|No route to host"
            r"|timeout expired"
        ),
        "unreachable",
    ),
    (
        re.compile(r"too many clients|remaining connection slots|too many connections for"),
        "no_free_slot",
    ),
    (
        re.compile(
            r"terminating connection due to administrator command|server closed the connection unexpectedly"
            r"|the database system is (?:shutting down|starting up|in recovery mode)"
        ),
        "restarting",
    ),
]

#: The failures no retry makes go away.
PERMANENT: frozenset[ConnectFailure] = frozenset(
    {"no_database", "login_refused", "not_permitted", "bad_setting"}
)


def check_database_url(url: str | None) -> None:
    """Raise MisconfiguredDatabaseError for a URL libpq cannot parse (None: the embedded database).
    The message never repeats the URL, which may hold a password."""
    if not url:
        return
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme is not None and scheme not in _SCHEMES:
        raise MisconfiguredDatabaseError(
            f"LEDGERFLOW_DATABASE_URL is malformed: unknown scheme {scheme + '://'!r}", f"use {URL_FORM}"
        )
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise MisconfiguredDatabaseError(
            "LEDGERFLOW_DATABASE_URL is malformed: neither a postgresql:// URL nor key=value settings",
            f"use {URL_FORM}",
        ) from None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # psycopg prefixes "connection failed: connection to server at ... failed: FATAL:  <reason>".
    return lines[0].rsplit("FATAL:", 1)[-1].strip() if lines else text


def connection_failed(exc: psycopg.OperationalError) -> DatabaseUnavailableError:
    """The ledgerflow error for a connection that failed or broke: refused for good, or unavailable."""
    message = str(exc)
    reason = _first_line(message) or type(exc).__name__
    failure: ConnectFailure = "other"
    database: str | None = None
    for pattern, kind in _KINDS:
        if (match := pattern.search(message)) is not None:
            # Only a connection attempt is refused: the error of a statement comes with a SQLSTATE.
            if kind not in PERMANENT or exc.sqlstate is None:
                failure, database = kind, match.groupdict().get("database")
            break
    if failure in PERMANENT:
        return DatabaseRefusedError(
            f"the database refused the connection: {reason}; "
            "fix LEDGERFLOW_DATABASE_URL or the server's set-up",
            reason=reason,
            failure=failure,
            database=database,
        )
    return DatabaseUnavailableError(
        f"the database connection failed: {exc}; retry once PostgreSQL answers",
        reason=reason,
        failure=failure,
    )

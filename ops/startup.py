"""What a process can know about its database set-up before it waits for anything.

A malformed LEDGERFLOW_DATABASE_URL, a database that does not exist and a refused login are mistakes, not
outages: waiting for them would look like an outage for ever. They end start-up at once with a typed
error (`MisconfiguredDatabaseError`), which the CLI prints as two lines; only an unreachable or busy server
is waited for.
"""

from __future__ import annotations

import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

from eventstore import ConfigurationError

_SCHEMES = ("postgresql", "postgres")
_URL_FORM = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (or key=value settings: host=... dbname=...)"

#: The driver's messages of a server that answered and refused: no retry makes them go away. (A failed
#: connection carries no SQLSTATE, so its text is all there is.)
_PERMANENT = re.compile(
    r"database \"[^\"]+\" does not exist|password authentication failed|role \"[^\"]+\" does not exist"
    r"|no password supplied|no pg_hba.conf entry|invalid connection option|invalid (integer )?value"
)


class MisconfiguredDatabaseError(ConfigurationError):
    """The database set-up is wrong in a way no wait will fix."""

    code = "database_misconfigured"

    def __init__(self, what: str, todo: str) -> None:
        super().__init__(f"{what}; {todo}")
        self.what, self.todo = what, todo


def check_database_url(url: str | None) -> None:
    """Raise MisconfiguredDatabaseError for a URL libpq cannot parse (None: the embedded database).
    The message never repeats the URL, which may hold a password."""
    if not url:
        return
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme is not None and scheme not in _SCHEMES:
        raise MisconfiguredDatabaseError(
            f"LEDGERFLOW_DATABASE_URL is malformed: unknown scheme {scheme + '://'!r}", f"use {_URL_FORM}"
        )
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise MisconfiguredDatabaseError(
            "LEDGERFLOW_DATABASE_URL is malformed: neither a postgresql:// URL nor key=value settings",
            f"use {_URL_FORM}",
        ) from None


def is_permanent(exc: BaseException) -> bool:
    """Whether `exc` (or the driver error under it) is a refusal no retry fixes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MisconfiguredDatabaseError):
            return True
        if isinstance(seen, psycopg.OperationalError | psycopg.ProgrammingError) and _PERMANENT.search(
            str(seen)
        ):
            return True
        seen = seen.__cause__
    return False

"""What the CLI says when it cannot start: one or two lines (what failed, what to do), never a traceback.

A wrong database URL, a server that is down, a missing database and an invalid setting are the first
things a new user meets; each gets its own advice. `ledgerflow --debug` shows the traceback as well.
"""

from __future__ import annotations

import re

import psycopg
import pydantic

from eventstore import DatabaseUnavailableError, LedgerflowError, redact
from ops.startup import MisconfiguredDatabaseError

#: The errors the CLI reports in a line or two (and exit status 1) instead of a traceback.
REPORTED = (LedgerflowError, psycopg.OperationalError, pydantic.ValidationError)

#: (pattern in the driver's message, advice). The first match wins.
_CONNECT_ADVICE: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"database \"(?P<db>[^\"]+)\" does not exist"),
        "create it (`createdb {db}` on that server) or point LEDGERFLOW_DATABASE_URL at an existing one",
    ),
    (
        re.compile(r"password authentication failed|role \"[^\"]+\" does not exist|no password supplied"),
        "check the user name and password in LEDGERFLOW_DATABASE_URL",
    ),
    (
        re.compile(
            r"Connection refused|could not translate host name|failed to resolve host|No route to host"
            r"|timeout expired"
        ),
        "start PostgreSQL there, fix the host and port in LEDGERFLOW_DATABASE_URL, or unset it to use "
        "the embedded database",
    ),
    (
        re.compile(r"too many clients|remaining connection slots"),
        "the server has no free connection slots: close idle clients or raise max_connections",
    ),
    (
        re.compile(
            r"terminating connection due to administrator command|server closed the connection unexpectedly"
            r"|the database system is (?:shutting down|starting up|in recovery mode)"
        ),
        "the server stopped or restarted (or the connection was cut) while the command ran: run it again "
        "once the server answers (`ledgerflow doctor` says whether it does)",
    ),
]
_FALLBACK_ADVICE = "check LEDGERFLOW_DATABASE_URL (`ledgerflow doctor` checks the whole set-up)"


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # psycopg prefixes "connection failed: connection to server at ... failed: FATAL:  <reason>".
    return lines[0].rsplit("FATAL:", 1)[-1].strip() if lines else text


def explain(exc: BaseException, database_url: str | None) -> tuple[str, str] | None:
    """(what failed, what to do) for the start-up errors a user can fix; None for anything else."""
    if isinstance(exc, MisconfiguredDatabaseError):
        return exc.what, exc.todo
    if isinstance(exc, pydantic.ValidationError):
        problems = "; ".join(_setting_problem(error) for error in exc.errors())
        return f"invalid setting: {problems}", "fix the variable (or unset it to use the default)"
    if isinstance(exc, psycopg.OperationalError | DatabaseUnavailableError):
        return explain_connect_failure(exc, database_url)
    return None  # ledgerflow's own errors already say what to do; the CLI prints them as they are


def explain_connect_failure(exc: BaseException, database_url: str | None) -> tuple[str, str]:
    """(what failed, what to do) for a failed connection: the driver's reason, and advice for it."""
    where = redact(database_url) if database_url else "the embedded database"
    driver = exc
    while not isinstance(driver, psycopg.Error) and driver.__cause__ is not None:
        driver = driver.__cause__
    message = str(driver)
    advice = next(
        (a.format(**m.groupdict()) for p, a in _CONNECT_ADVICE if (m := p.search(message))),
        _FALLBACK_ADVICE,
    )
    return f"cannot use the database at {where}: {_first_line(message)}", advice


def _setting_problem(error: object) -> str:
    assert isinstance(error, dict)
    field = ".".join(str(part) for part in error.get("loc", ()))
    value = error.get("input")
    variable = f"LEDGERFLOW_{field.upper()}" if field else "a setting"
    shown = "" if isinstance(value, dict) else f"={value}"
    return f"{variable}{shown}: {error.get('msg', 'invalid')}"

"""What the CLI says when it cannot start: one or two lines (what failed, what to do), never a traceback.

A wrong database URL, a server that is down, a missing database and an invalid setting are the first
things a new user meets; each gets its own advice. `ledgerflow --debug` shows the traceback as well.
"""

from __future__ import annotations

import pydantic

from eventstore import (
    DatabaseRefusedError,
    DatabaseUnavailableError,
    LedgerflowError,
    MisconfiguredDatabaseError,
    redact,
)

#: The errors the CLI reports in a line or two (and exit status 1) instead of a traceback. Driver errors
#: are not among them: eventstore translates them (a failed connection is a DatabaseUnavailableError).
REPORTED = (LedgerflowError, pydantic.ValidationError)

#: Advice by the kind of failure eventstore read in the driver's report (DatabaseUnavailableError.failure).
_CONNECT_ADVICE: dict[str, str] = {
    "no_database": "create it (`createdb {database}` on that server) or point LEDGERFLOW_DATABASE_URL at an "
    "existing one",
    "login_refused": "check the user name and password in LEDGERFLOW_DATABASE_URL",
    "unreachable": "start PostgreSQL there, fix the host and port in LEDGERFLOW_DATABASE_URL, or unset it to "
    "use the embedded database",
    "no_free_slot": "the server has no free connection slots: close idle clients or raise max_connections",
    "restarting": "the server stopped or restarted (or the connection was cut) while the command ran: run it "
    "again once the server answers (`ledgerflow doctor` says whether it does)",
}
_FALLBACK_ADVICE = "check LEDGERFLOW_DATABASE_URL (`ledgerflow doctor` checks the whole set-up)"


def explain(exc: BaseException, database_url: str | None) -> tuple[str, str] | None:
    """(what failed, what to do) for the start-up errors a user can fix; None for anything else."""
    if isinstance(exc, MisconfiguredDatabaseError):
        return exc.what, exc.todo
    if isinstance(exc, pydantic.ValidationError):
        problems = "; ".join(_setting_problem(error) for error in exc.errors())
        return f"invalid setting: {problems}", "fix the variable (or unset it to use the default)"
    if isinstance(exc, DatabaseUnavailableError):
        return explain_connect_failure(exc, database_url)
    return None  # ledgerflow's own errors already say what to do; the CLI prints them as they are


def explain_connect_failure(exc: DatabaseUnavailableError, database_url: str | None) -> tuple[str, str]:
    """(what failed, what to do) for a failed connection: the driver's reason, and advice for its kind."""
    where = redact(database_url) if database_url else "the embedded database"
    database = exc.database if isinstance(exc, DatabaseRefusedError) else None
    advice = _CONNECT_ADVICE.get(exc.failure, _FALLBACK_ADVICE).format(database=database or "DATABASE")
    return f"cannot use the database at {where}: {exc.reason or exc}", advice


def _setting_problem(error: object) -> str:
    assert isinstance(error, dict)
    field = ".".join(str(part) for part in error.get("loc", ()))
    value = error.get("input")
    variable = f"LEDGERFLOW_{field.upper()}" if field else "a setting"
    shown = "" if isinstance(value, dict) else f"={value}"
    return f"{variable}{shown}: {error.get('msg', 'invalid')}"

"""`ledgerflow doctor`: check the database, migrations, leases, the safe horizon and stuck work, and say
what to do about whatever is wrong."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import psycopg

from eventstore import EventStore
from eventstore.migrate import pending_migrations
from projector import Projection
from projector.health import projection_health
from workflows import queue

Level = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    detail: str
    advice: str = ""


def diagnose(
    store: EventStore, projections: list[Projection], *, abandoned_after: float = 30.0
) -> list[Finding]:
    found: list[Finding] = []
    began = time.monotonic()
    try:
        with store.pool.connection() as conn:
            conn.execute("SELECT 1")
            pending = pending_migrations(conn)
    except psycopg.Error as exc:
        return [
            Finding("database", "fail", str(exc), "check that PostgreSQL runs and LEDGERFLOW_DATABASE_URL")
        ]
    found.append(Finding("database", "ok", f"answers in {(time.monotonic() - began) * 1000:.0f} ms"))
    found.append(
        Finding(
            "migrations",
            "fail",
            f"pending: {', '.join(f'{m.version:04d}_{m.name}' for m in pending)}",
            "run `ledgerflow migrate`",
        )
        if pending
        else Finding("migrations", "ok", "all applied")
    )

    horizon = store.horizon()
    if horizon.holders and horizon.age_seconds > 60:
        h = horizon.holders[0]
        found.append(
            Finding(
                "safe horizon",
                "warn",
                f"held back {h.age_seconds:.0f}s by pid {h.pid} ({h.application or 'no name'}, {h.state}); "
                f"{horizon.waiting_events} events wait",
                "projections stall behind it: if it is stuck, end it with "
                f"SELECT pg_terminate_backend({h.pid})",
            )
        )
    else:
        found.append(Finding("safe horizon", "ok", f"{horizon.waiting_events} events waiting"))

    for p in projection_health(store, projections, abandoned_after=abandoned_after):
        if p.state == "blocked":
            found.append(
                Finding(
                    f"projection {p.name}",
                    "fail",
                    f"blocked by {p.open_failures} failure(s)",
                    "see `ledgerflow failures list`, then retry or skip",
                )
            )
        elif p.state in ("stopped", "new") and p.lag_events:
            found.append(
                Finding(
                    f"projection {p.name}",
                    "warn",
                    f"no worker holds it; {p.lag_events} events behind",
                    "start `ledgerflow projector` (or `ledgerflow serve`)",
                )
            )
        else:
            found.append(Finding(f"projection {p.name}", "ok", f"{p.state}, {p.lag_events} events behind"))

    with store.pool.connection() as conn:
        summary = queue.summary(conn)
    if summary.orphaned:
        found.append(
            Finding(
                "workflow leases",
                "warn",
                f"{summary.orphaned} node(s) with a lapsed lease",
                "a running worker reclaims them within its recovery interval; or `ledgerflow recover`",
            )
        )
    else:
        found.append(Finding("workflow leases", "ok", f"{summary.running} running, {summary.ready} waiting"))
    if summary.parked:
        found.append(
            Finding(
                "parked nodes",
                "warn",
                f"{summary.parked} node(s) crashed too often",
                "fix the cause, then `ledgerflow workflows retry RUN_ID`",
            )
        )
    return found

"""`ledgerflow doctor`: check the database, migrations, connection slots, workers, leases, the safe
horizon and stuck work, and say what to do about whatever is wrong.

Workers wait out database outages by themselves; doctor says so when it cannot reach the database,
and otherwise shows what the database sees of them: how many of each kind are connected, and whether
connection slots run out (a worker that cannot get one waits)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from eventstore import EventStore, LedgerflowError, pending_migrations
from eventstore.spi import fetch_all, fetch_one, load_queries
from projector import Projection, projection_health
from workflows import queue_summary, shared_worker_names, versions_without_worker

Level = Literal["ok", "warn", "fail"]
Q = load_queries("ops", "doctor.sql")
#: Workers wait out outages; this is what doctor tells an operator who cannot reach the database.
WORKERS_WAIT = (
    "check that PostgreSQL runs, has free connection slots, and LEDGERFLOW_DATABASE_URL; running workers "
    "wait and resume by themselves (each logs database_unavailable once; `serve` lists its roles waiting "
    "in /api/healthz)"
)


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    detail: str
    advice: str = ""


def unreachable(error: str) -> Finding:
    return Finding("database", "fail", error, WORKERS_WAIT)


def diagnose(
    store: EventStore, projections: list[Projection], *, abandoned_after: float = 30.0
) -> list[Finding]:
    found: list[Finding] = []
    began = time.monotonic()
    try:
        with store.connection() as conn:
            conn.execute(Q["ping"])
            pending = pending_migrations(conn)
            listeners = dict(fetch_all(conn, _connections_of, Q["listeners"]))
            slots = fetch_one(conn, _Slots, Q["connection_slots"]) or _Slots(0, 1)
    except LedgerflowError as exc:
        return [unreachable(str(exc))]
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
    if pending:
        return found  # the other checks read tables the migrations create

    projectors = int(listeners.get("ledgerflow-projector-listener", 0))
    workers = int(listeners.get("ledgerflow-workflow-listener", 0))
    found.append(
        Finding(
            "workers",
            "ok" if projectors and workers else "warn",
            f"{projectors} projector worker(s) and {workers} workflow worker(s) connected",
            ""
            if projectors and workers
            else "a worker waiting for the database is not connected yet: see its log; "
            "else start `ledgerflow projector`, `ledgerflow worker` or `ledgerflow serve`",
        )
    )
    used, usable = slots.used, slots.usable
    found.append(
        Finding("connection slots", "warn", f"{used} of {usable} in use", "workers needing one wait for it")
        if used >= 0.9 * usable
        else Finding("connection slots", "ok", f"{used} of {usable} in use")
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

    with store.connection() as conn:
        summary = queue_summary(conn)
        unserved = versions_without_worker(conn)
        namesakes = shared_worker_names(conn)
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
    for name, count in namesakes.items():
        found.append(
            Finding(
                f"worker name {name}",
                "warn",
                f"{count} live worker processes share the name {name!r}",
                "give each worker process a name of its own (`ledgerflow worker --name`), so logs and "
                "the console tell them apart",
            )
        )
    for w in unserved:
        found.append(
            Finding(
                f"workflow {w.workflow} version {w.version}",
                "warn",
                f"{w.runs} run(s) wait for version {w.version!r}, which no live worker has "
                f"({w.nodes} node(s) ready since {w.waiting_since:%Y-%m-%d %H:%M:%S %Z})",
                f"start a worker whose registry has version {w.version!r} of {w.workflow!r} "
                "(runs go on only with the version they started with)",
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class _Slots:
    """A row of connection_slots: the server's client connections, and how many it takes in all."""

    used: int
    usable: int


def _connections_of(*, application_name: str, connections: int) -> tuple[str, int]:
    """A row of listeners."""
    return application_name, connections

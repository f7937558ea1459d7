"""Changes to a run's queue rows that no node's end makes: an operator's cancel, pause, resume or
terminate, a signal that wakes waiting nodes, a claim given back. Each takes the caller's
connection, so that it commits with the run-stream event that records it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from eventstore.spi import fetch_all, fetch_one, fetch_value, synced
from workflows.queries import Q

Conn = psycopg.Connection[Any]


def lock_run_nodes(conn: Conn, run_id: uuid.UUID, tenant: str) -> bool:
    """Lock the run's queue rows (see the query); False when it has none: it is not active."""
    cursor = conn.execute(Q["lock_run_nodes"], {"run_id": run_id, "tenant": tenant})
    return bool(synced(cursor).fetchall())


def wake_waiting(conn: Conn, run_id: uuid.UUID, signal: str) -> None:
    """Make the run's nodes waiting for `signal` due now (in a pipeline: nothing is waited for)."""
    conn.execute(Q["wake_waiting"], {"run_id": run_id, "signal": signal})


def release(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    return conn.execute(Q["release"], {"run_id": run_id, "node": node, "token": token}).fetchone() is not None


def hand_back(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    """Hand back a node its run's pause interrupted; False if the claim no longer holds it."""
    params = {"run_id": run_id, "node": node, "token": token}
    return conn.execute(Q["hand_back"], params).fetchone() is not None


def cancel_run(conn: Conn, run_id: uuid.UUID) -> tuple[list[str], list[str]]:
    """Flag the run's claimed nodes and drop its waiting ones; returns (running, dropped) node names."""
    found = fetch_one(conn, _Cancelled, Q["cancel_run"], {"run_id": run_id})
    assert found is not None
    return found.running, found.dropped


def cancel_runs(conn: Conn, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[list[str], list[str]]]:
    """`cancel_run` for many runs in one statement; returns (running, dropped) node names per run."""
    rows = fetch_all(conn, _Cancelled, Q["cancel_runs"], {"run_ids": list(run_ids)})
    return {r.run_id: (r.running, r.dropped) for r in rows if r.run_id is not None}


@dataclass(frozen=True, slots=True)
class _Cancelled:
    """A row of cancel_run, or of cancel_runs (which names the run): the claimed nodes flagged to stop and
    the waiting ones dropped."""

    running: list[str]
    dropped: list[str]
    run_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class _Paused:
    """A row of pause_run: the claimed nodes left running and the ready ones held."""

    running: list[str]
    held: list[str]


def pause_run(conn: Conn, run_id: uuid.UUID, tenant: str, *, interrupt: bool) -> tuple[list[str], list[str]]:
    """Pause the run's queue (after `lock_run_nodes`); returns (running, held) node names."""
    params = {"run_id": run_id, "tenant": tenant, "interrupt": interrupt}
    found = fetch_one(conn, _Paused, Q["pause_run"], params)
    assert found is not None
    return found.running, found.held


def pause_runs(conn: Conn, run_ids: Sequence[uuid.UUID], tenant: str) -> int:
    """`pause_run` (running nodes finish) for many runs of `tenant` in one statement, their rows locked
    first; returns how many ready rows it held."""
    return int(fetch_value(conn, Q["pause_runs"], {"run_ids": list(run_ids), "tenant": tenant}))


def resume_runs(conn: Conn, run_ids: Sequence[uuid.UUID], tenant: str) -> int:
    """`resume_run` for many runs of `tenant` in one statement, their rows locked first; returns how many
    rows are ready again."""
    return int(fetch_value(conn, Q["resume_runs"], {"run_ids": list(run_ids), "tenant": tenant}))


def terminate_run(conn: Conn, run_id: uuid.UUID) -> list[str]:
    """Drop every queue row of the run (after `lock_run_nodes`); returns the nodes dropped."""
    dropped: list[str] = fetch_value(conn, Q["terminate_run"], {"run_id": run_id})
    return dropped


def resume_run(conn: Conn, run_id: uuid.UUID) -> list[str]:
    """Resume the run's queue (after `lock_run_nodes`); returns the nodes ready again."""
    ready: list[str] = fetch_value(conn, Q["resume_run"], {"run_id": run_id})
    return ready


def forget_pause(conn: Conn, run_id: uuid.UUID) -> None:
    """Drop the pause of a run that ended while paused, as it is reopened."""
    conn.execute(Q["forget_pause"], {"run_id": run_id})

"""The scheduler's queue in SQL: enqueueing, claiming, fencing, heartbeats, reclaiming.

The only module of `workflows` that runs SQL. Every function takes the caller's connection so that a
queue change commits in the same transaction as the run-stream event that causes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from eventstore.sqlfile import load_queries
from workflows.definition import NodeSpec

Q = load_queries("workflows")
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Claim:
    run_id: uuid.UUID
    node: str
    tenant: str
    workflow: str
    attempt: int
    token: int
    cancel_requested: bool
    crashes: int


@dataclass(frozen=True)
class Reclaimed:
    run_id: uuid.UUID
    node: str
    tenant: str
    attempt: int
    crashes: int
    status: str  # ready again, or parked
    previous_worker: str | None
    reason: str


@dataclass(frozen=True)
class Stuck:
    run_id: uuid.UUID
    node: str
    tenant: str
    attempt: int
    action: str
    token: int | None
    worker: str | None
    seconds: float


def enqueue(
    conn: Conn,
    run_id: uuid.UUID,
    tenant: str,
    workflow: str,
    specs: Sequence[NodeSpec],
    *,
    attempts: Mapping[str, int] | None = None,
    delay: float = 0.0,
    reset_crashes: bool = False,
) -> None:
    """Queue `specs` as ready; `attempts` gives the attempts each node already had in this run."""
    if not specs:
        return
    attempts = attempts or {}
    conn.execute(
        Q["enqueue"],
        {
            "run_id": run_id,
            "tenant": tenant,
            "workflow": workflow,
            "nodes": [s.name for s in specs],
            "attempts": [attempts.get(s.name, 0) for s in specs],
            "max_crashes": [s.max_crashes for s in specs],
            "progress_deadlines": [s.progress_deadline for s in specs],
            "on_stuck": [s.on_stuck for s in specs],
            "delays": [delay for _ in specs],
            "reset_crashes": reset_crashes,
        },
    )


def claim(
    conn: Conn, *, worker_name: str, instance: str, workflows: Sequence[str], limit: int, ttl: float
) -> list[Claim]:
    rows = conn.execute(
        Q["claim"],
        {
            "worker_name": worker_name,
            "instance": instance,
            "workflows": list(workflows),
            "limit": limit,
            "ttl": ttl,
        },
    ).fetchall()
    return [Claim(*r) for r in rows]


@dataclass(frozen=True)
class Claimant:
    """Who claims: a worker's name and process instance, its id for events, and its lease length."""

    worker_name: str
    instance: str
    worker_id: str
    ttl: float


def claim_node(conn: Conn, run_id: uuid.UUID, node: str, claimant: Claimant) -> Claim | None:
    row = conn.execute(
        Q["claim_node"],
        {
            "run_id": run_id,
            "node": node,
            "worker_name": claimant.worker_name,
            "instance": claimant.instance,
            "ttl": claimant.ttl,
        },
    ).fetchone()
    return None if row is None else Claim(*row)


def fence(conn: Conn, run_id: uuid.UUID, node: str, token: int, *, check_cancel: bool = True) -> None:
    conn.execute(Q["fence"], {"run_id": run_id, "node": node, "token": token, "check_cancel": check_cancel})


def finish(conn: Conn, run_id: uuid.UUID, node: str) -> None:
    conn.execute(Q["finish"], {"run_id": run_id, "node": node})


def schedule_retry(conn: Conn, run_id: uuid.UUID, node: str, delay: float) -> None:
    conn.execute(Q["schedule_retry"], {"run_id": run_id, "node": node, "delay": delay})


def release(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    return conn.execute(Q["release"], {"run_id": run_id, "node": node, "token": token}).fetchone() is not None


def heartbeat(conn: Conn, instance: str, tokens: Sequence[int], ttl: float) -> set[int]:
    rows = conn.execute(Q["heartbeat"], {"instance": instance, "tokens": list(tokens), "ttl": ttl}).fetchall()
    return {int(r[0]) for r in rows}


def reclaim(conn: Conn, *, worker_name: str, instance: str, limit: int) -> list[Reclaimed]:
    params = {"worker_name": worker_name, "instance": instance, "limit": limit}
    return [Reclaimed(*r) for r in conn.execute(Q["reclaim"], params).fetchall()]


def stuck(conn: Conn, limit: int) -> list[Stuck]:
    return [Stuck(*r) for r in conn.execute(Q["stuck"], {"limit": limit}).fetchall()]


def cancel_run(conn: Conn, run_id: uuid.UUID) -> tuple[list[str], list[str]]:
    """Flag the run's claimed nodes and drop its waiting ones; returns (running, dropped) node names."""
    row = conn.execute(Q["cancel_run"], {"run_id": run_id}).fetchone()
    assert row is not None
    return list(row[0]), list(row[1])


@dataclass(frozen=True)
class Recovery:
    id: int
    worker: str
    trigger: str
    started_at: datetime
    duration_ms: float
    found: int
    reclaimed: int
    parked: int
    stuck: int
    failed: int


def record_recovery(conn: Conn, **fields: Any) -> None:
    conn.execute(Q["record_recovery"], fields)


def recent_recoveries(conn: Conn, limit: int = 20) -> list[Recovery]:
    return [Recovery(*r) for r in conn.execute(Q["recent_recoveries"], {"limit": limit}).fetchall()]


@dataclass(frozen=True)
class QueueSummary:
    ready: int
    running: int
    orphaned: int
    parked: int


def summary(conn: Conn) -> QueueSummary:
    row = conn.execute(Q["queue_summary"]).fetchone()
    assert row is not None
    return QueueSummary(*row)

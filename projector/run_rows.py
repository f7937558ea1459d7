"""The projector's run rows: each catch-up, replay, rebuild and verify, its progress and how it ended.

Each function takes the caller's connection, so callers combine them in one transaction where a guarantee
needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import class_row

from eventstore import Cursor
from eventstore.spi import fetch_one, fetch_value, fetch_values, load_queries
from projector.cursor_rows import type_list

Q = load_queries("projector")
Conn = psycopg.Connection[Any]

RunKind = Literal["catch_up", "replay", "rebuild", "verify"]
RunStatus = Literal["running", "completed", "failed", "abandoned", "stopped"]


@dataclass(frozen=True)
class Run:
    id: int
    projection: str
    kind: str
    trigger: str
    actor: str
    owner: str
    status: str
    start_tx: int
    start_position: int
    end_tx: int | None
    end_position: int | None
    target_tx: int | None
    target_position: int | None
    events_processed: int
    started_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None
    digest: str | None
    error: str | None
    #: The tenant whose rows the run touched; None for a run over every tenant.
    tenant: str | None
    #: The events it goes through, counted at its start; None when not counted (catch-up runs).
    events_total: int | None = None

    @property
    def rate(self) -> float:
        """Events per second over the run so far."""
        end = self.ended_at or self.heartbeat_at
        seconds = (end - self.started_at).total_seconds()
        return self.events_processed / seconds if seconds > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """At the rate so far, the time until the events counted at the start are through."""
        if self.status != "running" or self.events_total is None or self.rate <= 0:
            return None
        return max(0.0, (self.events_total - self.events_processed) / self.rate)


def count_run_events(
    conn: Conn,
    run_id: int,
    *,
    start: Cursor,
    target: Cursor | None,
    tenant: str | None,
    types: Sequence[str] | None,
) -> int:
    """Count the events (of `types`; all with None) run `run_id` goes through; record it on the run."""
    counted = fetch_value(
        conn,
        Q["count_run_events"],
        {
            "run_id": run_id,
            "tenant": tenant,
            "types": type_list(types),
            "start_tx": start.transaction_id,
            "start_position": start.position,
            "target_tx": target.transaction_id if target else None,
            "target_position": target.position if target else None,
        },
    )
    return int(counted or 0)


def start_run(
    conn: Conn,
    projection: str,
    kind: RunKind,
    *,
    trigger: str,
    actor: str,
    owner: str,
    start: Cursor,
    target: Cursor | None = None,
    tenant: str | None = None,
) -> int:
    run_id = fetch_value(
        conn,
        Q["start_run"],
        {
            "projection": projection,
            "kind": kind,
            "trigger": trigger,
            "actor": actor,
            "owner": owner,
            "tenant": tenant,
            "start_tx": start.transaction_id,
            "start_position": start.position,
            "target_tx": target.transaction_id if target else None,
            "target_position": target.position if target else None,
        },
    )
    assert run_id is not None
    return int(run_id)


def run_progress(conn: Conn, run_id: int, cursor: Cursor, events: int) -> None:
    conn.execute(
        Q["run_progress"],
        {"run_id": run_id, "tx": cursor.transaction_id, "position": cursor.position, "events": events},
    )


def heartbeat_runs(conn: Conn, owner: str) -> None:
    conn.execute(Q["heartbeat_runs"], {"owner": owner})


def heartbeat_run(conn: Conn, run_id: int) -> None:
    conn.execute(Q["heartbeat_run"], {"run_id": run_id})


def finish_run(
    conn: Conn, run_id: int, status: RunStatus, *, error: str | None = None, digest: str | None = None
) -> None:
    conn.execute(Q["finish_run"], {"run_id": run_id, "status": status, "error": error, "digest": digest})


def mark_abandoned_runs(conn: Conn, timeout: float) -> list[tuple[int, str, str, str]]:
    return [tuple(r) for r in conn.execute(Q["mark_abandoned_runs"], {"timeout": timeout}).fetchall()]


def list_runs(
    conn: Conn, projection: str | None = None, limit: int = 50, *, tenant: str | None = None
) -> list[Run]:
    """Newest first. With `tenant`: the runs over every tenant and that tenant's own, no other's."""
    params = {"projection": projection, "limit": limit, "tenant": tenant}
    with conn.cursor(row_factory=class_row(Run)) as cur:
        return cur.execute(Q["list_runs"], params).fetchall()


def get_run(conn: Conn, run_id: int) -> Run | None:
    with conn.cursor(row_factory=class_row(Run)) as cur:
        return cur.execute(Q["get_run"], {"run_id": run_id}).fetchone()


def running_operator_run(conn: Conn, projection: str, tenant: str | None) -> tuple[int, str] | None:
    """(id, kind) of the rebuild, replay or verify holding this scope, if one runs."""
    params = {"projection": projection, "tenant": tenant}
    return fetch_one(conn, _run_and_kind, Q["running_operator_run"], params)


def _run_and_kind(*, id: int, kind: str) -> tuple[int, str]:
    """A row of running_operator_run."""
    return id, kind


def scratch_schemas(conn: Conn) -> list[str]:
    return fetch_values(conn, Q["scratch_schemas"])


def running_run_ids(conn: Conn) -> set[int]:
    return set(fetch_values(conn, Q["running_run_ids"]))


def active_run(conn: Conn, projection: str, kind: RunKind) -> tuple[int, Cursor | None] | None:
    return fetch_one(conn, _run_and_target, Q["active_run"], {"projection": projection, "kind": kind})


def _run_and_target(
    *,
    id: int,
    target_tx: int | None,
    target_position: int | None,
) -> tuple[int, Cursor | None]:
    """A row of active_run."""
    return id, None if target_tx is None or target_position is None else Cursor(target_tx, target_position)

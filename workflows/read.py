"""Reading the run and node tables (the `workflow_tables` projection) for lists, consoles and APIs.

These tables trail the log by the projector's lag; `Engine.load` folds a run's events for the exact
current state of one run.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.rows import dict_row

from eventstore import EventStore
from workflows.queue import Q


def list_runs(
    store: EventStore, *, tenant: str, status: str | None = None, workflow: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    params = {"tenant": tenant, "status": status, "workflow": workflow, "limit": limit}
    with store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["list_runs"], params).fetchall()


def run_nodes(store: EventStore, run_id: uuid.UUID) -> list[dict[str, Any]]:
    with store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["run_nodes"], {"run_id": run_id}).fetchall()

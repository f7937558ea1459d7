"""Reading the run and node tables (the `workflow_tables` projection) for lists, consoles and APIs.

These tables trail the log by the projector's lag, and exist once a projector has started;
`Engine.load` folds a run's events for the exact current state of one run.
"""

from __future__ import annotations

import uuid
from typing import Any, LiteralString

from psycopg.rows import dict_row

from eventstore import EventStore, MissingRelationError
from workflows.errors import wrap_exceptions
from workflows.queries import Q


def _rows(store: EventStore, query: LiteralString, params: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        with wrap_exceptions(), store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(query, params).fetchall()
    except MissingRelationError:
        return []  # no projector has created the tables yet: no runs to show


def list_runs(
    store: EventStore, *, tenant: str, status: str | None = None, workflow: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    return _rows(
        store, Q["list_runs"], {"tenant": tenant, "status": status, "workflow": workflow, "limit": limit}
    )


def run_nodes(store: EventStore, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return _rows(store, Q["run_nodes"], {"run_id": run_id})

"""The rows of the workflow tables (`workflows.projections`): a run's state as its `workflow_runs` and
`workflow_nodes` rows, those rows back as the part of the state they hold, and the statements that load
and write them, one round trip each.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from projector import ApplyContext
from workflows import event_models as em
from workflows.run_state import NodeState, RunState
from workflows.scheduler import NodeStatus

RUN_COLUMNS = (
    "run_id",
    "tenant",
    "workflow",
    "key",
    "status",
    "current_node",
    "nodes_total",
    "nodes_done",
    "input",
    "error",
    "cancel_requested",
    "created_at",
    "updated_at",
    "finished_at",
    "workflow_version",
    "triggered_by",
    "tags",
)
NODE_COLUMNS = (
    "run_id",
    "node",
    "position",
    "status",
    "attempt",
    "crashes",
    "generation",
    "progress_current",
    "progress_total",
    "progress_message",
    "checkpoints",
    "worker",
    "error",
    "stuck",
    "started_at",
    "finished_at",
    "duration_ms",
    "updated_at",
    "waiting_for",
    "wake_at",
)

_INPUT = RUN_COLUMNS.index("input")
RunRow = tuple[Any, ...]
NodeRow = tuple[Any, ...]


def run_row(run: RunState) -> RunRow:
    """The run's `workflow_runs` row, in RUN_COLUMNS order."""
    return (
        run.run_id,
        run.tenant,
        run.workflow,
        run.key,
        run.status,
        run.current_node,
        len(run.nodes),
        run.nodes_done,
        run.input,
        run.error,
        run.cancel_requested,
        run.started_at,
        run.updated_at,
        run.finished_at,
        run.workflow_version,
        run.triggered_by.model_dump() if run.triggered_by is not None else None,
        run.tags,
    )


def node_row(run_id: uuid.UUID, n: NodeState) -> NodeRow:
    """A node's `workflow_nodes` row, in NODE_COLUMNS order."""
    current, total, message = n.progress if n.progress is not None else (None, None, None)
    return (
        run_id,
        n.name,
        n.position,
        str(n.status),
        n.attempt,
        n.crashes,
        n.generation,
        current,
        total,
        message,
        n.checkpoints_taken,
        n.worker,
        n.error,
        n.stuck,
        n.started_at,
        n.finished_at,
        n.duration_ms,
        n.updated_at,
        n.waiting_for,
        n.wake_at,
    )


def state_from_rows(run: dict[str, Any], nodes: Sequence[dict[str, Any]]) -> RunState:
    """The part of a run's state its rows hold: all that the fold needs to write the next rows. (What the
    rows leave out, such as checkpoint outputs and memoized steps, no row depends on.)"""
    triggered = run["triggered_by"]
    state = RunState(
        run["run_id"],
        run["tenant"],
        workflow=run["workflow"],
        key=run["key"],
        input=run["input"],
        status=run["status"],
        cancel_requested=run["cancel_requested"],
        error=run["error"],
        started_at=run["created_at"],
        finished_at=run["finished_at"],
        current_node=run["current_node"],
        updated_at=run["updated_at"],
        workflow_version=run["workflow_version"],
        triggered_by=em.TriggeringEvent.model_validate(triggered) if triggered is not None else None,
        tags=dict(run["tags"]),
    )
    for r in sorted(nodes, key=lambda r: r["position"]):
        progress = None
        if r["progress_current"] is not None:
            progress = (r["progress_current"], r["progress_total"], r["progress_message"])
        state.nodes[r["node"]] = NodeState(
            r["node"],
            status=NodeStatus(r["status"]),
            attempt=r["attempt"],
            crashes=r["crashes"],
            worker=r["worker"],
            generation=r["generation"],
            error=r["error"],
            progress=progress,
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            position=r["position"],
            checkpoints_taken=r["checkpoints"],
            stuck=r["stuck"],
            duration_ms=r["duration_ms"],
            updated_at=r["updated_at"],
            waiting_for=r["waiting_for"],
            wake_at=r["wake_at"],
        )
    return state


# One round trip: each run's row with its nodes' columns as arrays in node order (a join would repeat
# the run's input once per node).
_LOAD = """
SELECT r.*, n.*
  FROM {workflow_runs} r
  CROSS JOIN LATERAL (
        SELECT array_agg(node ORDER BY position) AS n_node,
               array_agg(position ORDER BY position) AS n_position,
               array_agg(status ORDER BY position) AS n_status,
               array_agg(attempt ORDER BY position) AS n_attempt,
               array_agg(crashes ORDER BY position) AS n_crashes,
               array_agg(generation ORDER BY position) AS n_generation,
               array_agg(progress_current ORDER BY position) AS n_progress_current,
               array_agg(progress_total ORDER BY position) AS n_progress_total,
               array_agg(progress_message ORDER BY position) AS n_progress_message,
               array_agg(checkpoints ORDER BY position) AS n_checkpoints,
               array_agg(worker ORDER BY position) AS n_worker,
               array_agg(error ORDER BY position) AS n_error,
               array_agg(stuck ORDER BY position) AS n_stuck,
               array_agg(started_at ORDER BY position) AS n_started_at,
               array_agg(finished_at ORDER BY position) AS n_finished_at,
               array_agg(duration_ms ORDER BY position) AS n_duration_ms,
               array_agg(updated_at ORDER BY position) AS n_updated_at,
               array_agg(waiting_for ORDER BY position) AS n_waiting_for,
               array_agg(wake_at ORDER BY position) AS n_wake_at
          FROM {workflow_nodes}
         WHERE run_id = r.run_id
       ) n
 WHERE r.run_id = ANY(%(ids)s)
"""
# One statement, one round trip: the changed rows of both tables as parallel arrays (either may be
# empty), inserted or updated in place.
_UPSERT = """
WITH runs AS (
    INSERT INTO {workflow_runs} (run_id, tenant, workflow, key, status, current_node, nodes_total, nodes_done,
                                 input, error, cancel_requested, created_at, updated_at, finished_at,
                                 workflow_version, triggered_by, tags)
    SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::int[],
                         %s::int[], %s::jsonb[], %s::text[], %s::bool[], %s::timestamptz[], %s::timestamptz[],
                         %s::timestamptz[], %s::text[], %s::jsonb[], %s::jsonb[])
    ON CONFLICT (run_id) DO UPDATE
       SET tenant = EXCLUDED.tenant, workflow = EXCLUDED.workflow, key = EXCLUDED.key,
           status = EXCLUDED.status, current_node = EXCLUDED.current_node, nodes_total = EXCLUDED.nodes_total,
           nodes_done = EXCLUDED.nodes_done, input = EXCLUDED.input, error = EXCLUDED.error,
           cancel_requested = EXCLUDED.cancel_requested, created_at = EXCLUDED.created_at,
           updated_at = EXCLUDED.updated_at, finished_at = EXCLUDED.finished_at,
           workflow_version = EXCLUDED.workflow_version, triggered_by = EXCLUDED.triggered_by,
           tags = EXCLUDED.tags
)
INSERT INTO {workflow_nodes} (run_id, node, position, status, attempt, crashes, generation, progress_current,
                              progress_total, progress_message, checkpoints, worker, error, stuck, started_at,
                              finished_at, duration_ms, updated_at, waiting_for, wake_at)
SELECT * FROM unnest(%s::uuid[], %s::text[], %s::int[], %s::text[], %s::int[], %s::int[], %s::int[],
                     %s::bigint[], %s::bigint[], %s::text[], %s::int[], %s::text[], %s::text[], %s::bool[],
                     %s::timestamptz[], %s::timestamptz[], %s::float8[], %s::timestamptz[], %s::text[],
                     %s::timestamptz[])
ON CONFLICT (run_id, node) DO UPDATE
   SET position = EXCLUDED.position, status = EXCLUDED.status, attempt = EXCLUDED.attempt,
       crashes = EXCLUDED.crashes, generation = EXCLUDED.generation,
       progress_current = EXCLUDED.progress_current, progress_total = EXCLUDED.progress_total,
       progress_message = EXCLUDED.progress_message, checkpoints = EXCLUDED.checkpoints,
       worker = EXCLUDED.worker, error = EXCLUDED.error, stuck = EXCLUDED.stuck,
       started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
       duration_ms = EXCLUDED.duration_ms, updated_at = EXCLUDED.updated_at,
       waiting_for = EXCLUDED.waiting_for, wake_at = EXCLUDED.wake_at
"""


def load_states(ctx: ApplyContext, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, RunState]:
    """The states of those runs that have rows, from their rows."""
    if not run_ids:
        return {}
    with ctx.conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(ctx.sql(_LOAD), {"ids": run_ids}).fetchall()
    return {r["run_id"]: state_from_rows(r, _node_rows(r)) for r in found}


def _node_rows(loaded: dict[str, Any]) -> list[dict[str, Any]]:
    """The node rows of a loaded run, from its `n_<column>` arrays (NULL when the run has no nodes)."""
    columns = [c for c in NODE_COLUMNS if c != "run_id"]
    arrays = [loaded[f"n_{c}"] or [] for c in columns]
    return [dict(zip(columns, values, strict=True)) for values in zip(*arrays, strict=True)]


def write_rows(ctx: ApplyContext, changed_runs: Sequence[RunRow], changed_nodes: Sequence[NodeRow]) -> None:
    """Insert or update the changed rows of both tables, in one statement."""
    json_columns = [RUN_COLUMNS.index(c) for c in ("input", "triggered_by", "tags")]
    runs_columns = _columns(changed_runs, len(RUN_COLUMNS), json_columns=json_columns)
    ctx.execute(_UPSERT, [*runs_columns, *_columns(changed_nodes, len(NODE_COLUMNS))])


def _columns(
    rows: Sequence[tuple[Any, ...]], width: int, json_columns: Sequence[int] = ()
) -> list[list[Any]]:
    """Rows as one list per column, for `unnest` (`width` empty lists when there are no rows)."""
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]
    for c in json_columns:
        # `input` is written as JSON even when null (as it always was); other JSON columns as SQL NULL.
        keep_null = c == _INPUT
        columns[c] = [Jsonb(v) if v is not None or keep_null else None for v in columns[c]]
    return columns

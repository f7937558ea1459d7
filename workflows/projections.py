"""The run and node tables people and schedulers read, kept by the projector from the run streams.

`ledgerflow.workflow_runs` (one row per run) and `ledgerflow.workflow_nodes` (one row per node of a run:
status, attempt, progress current/total/message, error, timings, worker). The rows are the run's state
as `workflows.run_state` folds it, written as columns: for each batch, the touched runs are loaded back from
their rows, the batch's events are applied with that same fold, and the rows that changed are written
in one statement per table. So the tables and the worker cannot disagree about what an event means, and
a rebuild gives the same rows (every value, times included, comes from the events): equal digests.

The same batch keeps the runs' snapshots (`workflows.snapshots.keep_up`): a run that the batch moved
`LEDGERFLOW_RUN_SNAPSHOT_EVERY` versions or more past its snapshot gets a new one, so loading a long run
never waits for a fold of its whole history. Snapshots are a cache outside the projection's tables
(migrations/0030): a rebuild rewrites none that are current, and its digests do not cover them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from eventstore import RecordedEvent
from projector import ApplyContext, Projection, Table
from workflows import event_codec as codec
from workflows import event_models as em
from workflows import events as ev
from workflows import search_rows, snapshots
from workflows.caps import RunCaps
from workflows.run_state import NodeState, RunState, apply_event
from workflows.scheduler import NodeStatus

workflow_tables = Projection(
    name="workflow_tables",
    # 2: rows are the fold of workflows.run_state (a node reclaimed has no worker, a retried node's crashes
    # restart at 0, a refresh starts its nodes afresh, nodes_total counts nodes added by a refresh).
    # 3: a node that waits (a timer or a signal) has its own status, with what it waits for and until when.
    # 4: runs carry their definition's version, triggering event, parent run and tags, with indexes for
    # searching them (workflows.run_search); `workflow_run_tags` holds one row per tag of a run.
    version=4,
    # Shared: workflow_nodes rows carry no tenant, so only a server administrator rebuilds the tables.
    per_tenant=False,
    # The fold counts (crashes, checkpoints): applying an event twice would count it twice, so a replay of
    # these tables is carried out as a rebuild.
    replay_in_place=False,
    # Every run event whose fold changes a row; memos (steps, child runs) change none and are not read.
    event_types=[
        ev.RUN_STARTED,
        ev.NODES_READY,
        ev.NODE_CLAIMED,
        ev.NODE_PROGRESS,
        ev.NODE_CHECKPOINT,
        ev.NODE_SUCCEEDED,
        ev.NODE_RETRY_SCHEDULED,
        ev.NODE_FAILED,
        ev.NODE_RECLAIMED,
        ev.NODE_RELEASED,
        ev.NODE_STUCK,
        ev.NODE_PARKED,
        ev.NODE_CANCELLED,
        ev.NODE_WAITING,
        ev.RUN_CANCEL_REQUESTED,
        ev.RUN_RETRIED,
        ev.RUN_REFRESHED,
        ev.RUN_COMPLETED,
        ev.RUN_FAILED,
        ev.RUN_CANCELLED,
        ev.RUN_CONTINUED_AS_NEW,
        ev.RUN_TAGGED,
        # Read only to link a child run to its parent (search_rows): it changes no row of the parent.
        ev.CHILD_STARTED,
        ev.RUN_PAUSED,
        ev.RUN_RESUMED,
        # Retention: a released run's rows go, a restored run's come back (workflows.retention).
        ev.RUN_RELEASED,
        ev.RUN_RESTORED,
    ],
    tables=[
        Table(
            "workflow_runs",
            """CREATE TABLE {table} (
                   run_id        uuid        PRIMARY KEY,
                   tenant        text        NOT NULL,
                   workflow      text        NOT NULL,
                   key           text,
                   status        text        NOT NULL,
                   current_node  text,
                   nodes_total   integer     NOT NULL,
                   nodes_done    integer     NOT NULL DEFAULT 0,
                   input         jsonb,
                   error         text,
                   cancel_requested boolean  NOT NULL DEFAULT false,
                   created_at    timestamptz NOT NULL,
                   updated_at    timestamptz NOT NULL,
                   finished_at   timestamptz,
                   workflow_version text     NOT NULL DEFAULT '1',
                   triggered_by  jsonb,
                   tags          jsonb       NOT NULL DEFAULT '{{}}',
                   parent_run_id uuid
               );
               """
            + search_rows.RUN_INDEXES,
        ),
        Table("workflow_run_tags", search_rows.TAGS_DDL),
        Table(
            "workflow_nodes",
            """CREATE TABLE {table} (
                   run_id            uuid        NOT NULL,
                   node              text        NOT NULL,
                   position          integer     NOT NULL,
                   status            text        NOT NULL,
                   attempt           integer     NOT NULL DEFAULT 0,
                   crashes           integer     NOT NULL DEFAULT 0,
                   generation        integer,
                   progress_current  bigint,
                   progress_total    bigint,
                   progress_message  text,
                   checkpoints       integer     NOT NULL DEFAULT 0,
                   worker            text,
                   error             text,
                   stuck             boolean     NOT NULL DEFAULT false,
                   started_at        timestamptz,
                   finished_at       timestamptz,
                   duration_ms       float8,
                   updated_at        timestamptz NOT NULL,
                   waiting_for       text,
                   wake_at           timestamptz,
                   PRIMARY KEY (run_id, node)
               )""",
        ),
    ],
)

# -- rows of a run's state, and a run's state from its rows ------------------------------------------

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


# -- applying a batch -------------------------------------------------------------------------------

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


@workflow_tables.on_batch
def _apply_batch(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
    parsed = [(codec.parse(e), e) for e in events if codec.is_workflow_event(e)]
    typed = [(event, e) for event, e in parsed if not isinstance(event, em.ChildStarted)]
    runs = _load(ctx, _runs_to_load(typed))
    before_runs = {run_id: run_row(run) for run_id, run in runs.items()}
    before_nodes = {
        (run_id, n.name): node_row(run_id, n) for run_id, run in runs.items() for n in run.nodes.values()
    }
    released: set[uuid.UUID] = set()
    restored: list[tuple[str, uuid.UUID]] = []
    for event, e in typed:
        if isinstance(event, em.RunReleased):
            _release(ctx, event.run_id, runs, before_runs, before_nodes)
            released.add(event.run_id)
            continue
        if isinstance(event, em.RunRestored):
            runs[event.run_id] = snapshots.fold_upto(ctx.conn, event.run_id, e.tenant, e.stream_version)
            released.discard(event.run_id)
            restored.append((e.tenant, event.run_id))
            continue
        run = runs.get(event.run_id)
        if run is None:
            if not isinstance(event, em.RunStarted):
                continue  # a run whose start is not in the log has no rows to change
            run = runs[event.run_id] = RunState(event.run_id, e.tenant)
        run.version = e.stream_version
        apply_event(run, event, e.recorded_at)
    changed_runs = [row for run_id, run in runs.items() if (row := run_row(run)) != before_runs.get(run_id)]
    changed_nodes = [
        row
        for run_id, run in runs.items()
        for n in run.nodes.values()
        if (row := node_row(run_id, n)) != before_nodes.get((run_id, n.name))
    ]
    if changed_runs or changed_nodes:
        json_columns = [RUN_COLUMNS.index(c) for c in ("input", "triggered_by", "tags")]
        runs_columns = _columns(changed_runs, len(RUN_COLUMNS), json_columns=json_columns)
        ctx.execute(_UPSERT, [*runs_columns, *_columns(changed_nodes, len(NODE_COLUMNS))])
    search_rows.keep_tags(ctx, _tags_changed(runs, before_runs))
    search_rows.link_children(
        ctx, [(e.tenant, event) for event, e in parsed if isinstance(event, em.ChildStarted)]
    )
    search_rows.link_restored(ctx, restored)
    heads = {key: head for key, head in _heads(typed).items() if key[1] not in released}
    snapshots.keep_up(ctx.conn, heads, RunCaps().run_snapshot_every)


_RELEASE_ROWS = """
WITH runs AS (DELETE FROM {workflow_runs} WHERE run_id = %(run_id)s),
     nodes AS (DELETE FROM {workflow_nodes} WHERE run_id = %(run_id)s),
     snapshots AS (DELETE FROM ledgerflow.workflow_run_snapshots WHERE run_id = %(run_id)s),
     signals AS (DELETE FROM ledgerflow.workflow_run_signal_counts WHERE run_id = %(run_id)s)
DELETE FROM {workflow_run_tags} WHERE run_id = %(run_id)s
"""


def _release(
    ctx: ApplyContext,
    run_id: uuid.UUID,
    runs: dict[uuid.UUID, RunState],
    before_runs: dict[uuid.UUID, RunRow],
    before_nodes: dict[tuple[uuid.UUID, str], NodeRow],
) -> None:
    """The run's rows leave the tables now, and the batch forgets it: its later events change no row,
    unless a restore (later in the batch) brings it back, which then writes every row afresh. Its snapshot
    and signal count go too: they are caches of a run nobody runs (a load folds its stream again)."""
    ctx.execute(_RELEASE_ROWS, {"run_id": run_id})
    runs.pop(run_id, None)
    before_runs.pop(run_id, None)
    for key in [k for k in before_nodes if k[0] == run_id]:
        del before_nodes[key]


def _tags_changed(runs: dict[uuid.UUID, RunState], before: dict[uuid.UUID, RunRow]) -> list[RunState]:
    """The runs whose tags this batch changed (new runs with tags among them)."""
    column = RUN_COLUMNS.index("tags")
    return [
        run
        for run_id, run in runs.items()
        if run.tags != (before[run_id][column] if run_id in before else {})
    ]


def _heads(typed: Sequence[tuple[em.WorkflowEvent, RecordedEvent]]) -> dict[tuple[str, uuid.UUID], int]:
    """The stream version this batch reached in each run's stream (events of key streams left out). The
    batch reads only the types above; the versions count every event of the stream all the same."""
    heads: dict[tuple[str, uuid.UUID], int] = {}
    for event, e in typed:
        if e.stream_id == ev.run_stream(event.run_id):
            key = (e.tenant, event.run_id)
            heads[key] = max(heads.get(key, 0), e.stream_version)
    return heads


def _runs_to_load(typed: Sequence[tuple[em.WorkflowEvent, RecordedEvent]]) -> list[uuid.UUID]:
    """The runs with events in this batch that did not start in it (those have rows already, if any)."""
    seen: set[uuid.UUID] = set()
    wanted: list[uuid.UUID] = []
    for event, _ in typed:
        if event.run_id not in seen:
            seen.add(event.run_id)
            if not isinstance(event, em.RunStarted):
                wanted.append(event.run_id)
    return wanted


def _load(ctx: ApplyContext, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, RunState]:
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

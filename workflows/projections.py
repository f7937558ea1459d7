"""The run and node tables people and schedulers read, kept by the projector from the run streams.

`ledgerflow.workflow_runs` (one row per run) and `ledgerflow.workflow_nodes` (one row per node of a run:
status, attempt, progress current/total/message, error, timings, worker). The rows are the run's state as
`workflows.run_fold` folds it, written as columns: for each batch, the touched runs are loaded back from
their rows, the batch's events are applied with that same fold, and the rows that changed are written in
one statement per table (the rows and their statements: `workflows.run_rows`). So the tables and the
worker cannot disagree about what an event means, and a rebuild gives the same rows (every value, times
included, comes from the events): equal digests.

The same batch keeps the runs' snapshots (`workflows.snapshots.keep_up`): a run that the batch moved
`LEDGERFLOW_RUN_SNAPSHOT_EVERY` versions or more past its snapshot gets a new one, so loading a long run
never waits for a fold of its whole history. Snapshots are a cache outside the projection's tables
(migrations/0030): a rebuild rewrites none that are current, and its digests do not cover them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from eventstore import RecordedEvent
from projector import ApplyContext, Projection, Table
from workflows import event_codec as codec
from workflows import event_models as em
from workflows import events as ev
from workflows import node_event_models as nem
from workflows import search_rows, snapshots
from workflows.caps import RunCaps
from workflows.run_fold import apply_event
from workflows.run_rows import RUN_COLUMNS, NodeRow, RunRow, load_states, node_row, run_row, write_rows
from workflows.run_state import RunState

workflow_tables = Projection(
    name="workflow_tables",
    # 2: rows are the fold of workflows.run_fold (a node reclaimed has no worker, a retried node's crashes
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

# -- applying a batch -------------------------------------------------------------------------------


@workflow_tables.on_batch
def _apply_batch(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
    parsed = [(codec.parse(e), e) for e in events if codec.is_workflow_event(e)]
    typed = [(event, e) for event, e in parsed if not isinstance(event, nem.ChildStarted)]
    runs = load_states(ctx, _runs_to_load(typed))
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
        write_rows(ctx, changed_runs, changed_nodes)
    search_rows.keep_tags(ctx, _tags_changed(runs, before_runs))
    search_rows.link_children(
        ctx, [(e.tenant, event) for event, e in parsed if isinstance(event, nem.ChildStarted)]
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

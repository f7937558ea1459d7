"""The run and node tables people and schedulers read, kept by the projector from the run streams.

`ledgerflow.workflow_runs` (one row per run) and `ledgerflow.workflow_nodes` (one row per node of a run:
status, attempt, progress current/total/message, error, timings, worker). Every value comes from the
events (times are the events' recorded times), so a rebuild gives the same rows: equal digests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, LiteralString

from eventstore import RecordedEvent
from projector import ApplyContext, Projection, Table
from workflows import events as ev

workflow_tables = Projection(
    name="workflow_tables",
    version=1,
    # Shared: workflow_nodes rows carry no tenant, so only a server administrator rebuilds the tables.
    per_tenant=False,
    # Inserts and counters (nodes_done, crashes, checkpoints) cannot be applied twice: a replay of these
    # tables is carried out as a rebuild.
    replay_in_place=False,
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
        ev.RUN_CANCEL_REQUESTED,
        ev.RUN_RETRIED,
        ev.RUN_REFRESHED,
        ev.RUN_COMPLETED,
        ev.RUN_FAILED,
        ev.RUN_CANCELLED,
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
                   finished_at   timestamptz
               );
               CREATE INDEX workflow_runs_by_status ON {table} (tenant, status, created_at DESC)""",
        ),
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
                   PRIMARY KEY (run_id, node)
               )""",
        ),
    ],
)

Handler = Callable[[ApplyContext, RecordedEvent, dict[str, Any]], None]
_HANDLERS: dict[str, Handler] = {}


def _on(*types: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return register


@workflow_tables.on_any
def _apply(ctx: ApplyContext, e: RecordedEvent) -> None:
    handler = _HANDLERS.get(e.type)
    if handler is not None:
        handler(ctx, e, e.data)


def _node(
    ctx: ApplyContext, e: RecordedEvent, node: str, assignments: LiteralString, params: dict[str, Any]
) -> None:
    # `assignments` is one of the fixed SET clauses below (a LiteralString), never built from event data.
    ctx.execute(
        "UPDATE {workflow_nodes} SET " + assignments + ", updated_at = %(at)s "
        "WHERE run_id = %(run_id)s AND node = %(node)s",
        {"run_id": e.data["run_id"], "node": node, "at": e.recorded_at, **params},
    )


def _run(ctx: ApplyContext, e: RecordedEvent, assignments: LiteralString, params: dict[str, Any]) -> None:
    ctx.execute(
        "UPDATE {workflow_runs} SET " + assignments + ", updated_at = %(at)s WHERE run_id = %(run_id)s",
        {"run_id": e.data["run_id"], "at": e.recorded_at, **params},
    )


@_on(ev.RUN_STARTED)
def _started(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    nodes = d["nodes"]  # in topological order (the fingerprints object's key order is not kept by jsonb)
    ctx.execute(
        """INSERT INTO {workflow_runs} (run_id, tenant, workflow, key, status, nodes_total, input, created_at,
                                        updated_at)
           VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, %s)""",
        (
            d["run_id"],
            e.tenant,
            d["workflow"],
            d.get("key"),
            len(nodes),
            _json(d.get("input")),
            e.recorded_at,
            e.recorded_at,
        ),
    )
    ctx.executemany(
        """INSERT INTO {workflow_nodes} (run_id, node, position, status, updated_at)
           VALUES (%s, %s, %s, 'pending', %s)""",
        [(d["run_id"], n, i, e.recorded_at) for i, n in enumerate(nodes)],
    )


@_on(ev.NODES_READY)
def _ready(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    for node in d["nodes"]:
        _node(ctx, e, node, "status = 'ready'", {})


@_on(ev.NODE_CLAIMED)
def _claimed(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(
        ctx,
        e,
        d["node"],
        "status = 'running', attempt = %(attempt)s, worker = %(worker)s, started_at = %(at)s, "
        "finished_at = NULL, progress_current = NULL, progress_total = NULL, progress_message = NULL, "
        "stuck = false",
        {"attempt": d["attempt"], "worker": d["worker"]},
    )
    _run(ctx, e, "current_node = %(node)s", {"node": d["node"]})


@_on(ev.NODE_PROGRESS)
def _progress(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(
        ctx,
        e,
        d["node"],
        "progress_current = %(current)s, progress_total = %(total)s, progress_message = %(message)s",
        {"current": d["current"], "total": d.get("total"), "message": d.get("message", "")},
    )


@_on(ev.NODE_CHECKPOINT)
def _checkpoint(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(ctx, e, d["node"], "checkpoints = checkpoints + 1", {})


@_on(ev.NODE_SUCCEEDED)
def _succeeded(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(
        ctx,
        e,
        d["node"],
        "status = 'succeeded', generation = %(generation)s, finished_at = %(at)s, "
        "duration_ms = %(duration)s, error = NULL",
        {"generation": d["generation"], "duration": d.get("duration_ms")},
    )
    _run(ctx, e, "nodes_done = nodes_done + 1", {})


@_on(ev.NODE_RETRY_SCHEDULED)
def _retry_scheduled(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(ctx, e, d["node"], "status = 'retry_scheduled', error = %(error)s", {"error": d["error"]})


@_on(ev.NODE_FAILED)
def _failed(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(
        ctx, e, d["node"], "status = 'failed', error = %(error)s, finished_at = %(at)s", {"error": d["error"]}
    )


@_on(ev.NODE_RECLAIMED, ev.NODE_RELEASED)
def _reclaimed(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    crash = 1 if e.type == ev.NODE_RECLAIMED else 0
    _node(
        ctx, e, d["node"], "status = 'ready', worker = NULL, crashes = crashes + %(crash)s", {"crash": crash}
    )


@_on(ev.NODE_STUCK)
def _stuck(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(ctx, e, d["node"], "stuck = true", {})


@_on(ev.NODE_PARKED)
def _parked(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(
        ctx,
        e,
        d["node"],
        "status = 'parked', error = %(error)s, crashes = %(crashes)s",
        {"error": d.get("error"), "crashes": d.get("crashes", 0)},
    )


@_on(ev.NODE_CANCELLED)
def _node_cancelled(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _node(ctx, e, d["node"], "status = 'cancelled', finished_at = %(at)s", {})


@_on(ev.RUN_CANCEL_REQUESTED)
def _cancel_requested(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    _run(ctx, e, "cancel_requested = true", {})


@_on(ev.RUN_RETRIED, ev.RUN_REFRESHED)
def _reopened(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    for node in d["nodes"]:
        _node(ctx, e, node, "status = 'pending', error = NULL, finished_at = NULL, stuck = false", {})
    ctx.execute(
        """UPDATE {workflow_runs} SET status = 'running', error = NULL, finished_at = NULL,
                  cancel_requested = false, updated_at = %(at)s,
                  nodes_done = (SELECT count(*) FROM {workflow_nodes} n
                                 WHERE n.run_id = %(run_id)s AND n.status = 'succeeded')
            WHERE run_id = %(run_id)s""",
        {"run_id": d["run_id"], "at": e.recorded_at},
    )
    if e.type == ev.RUN_REFRESHED:
        _run(ctx, e, "input = %(input)s", {"input": _json(d.get("input"))})


@_on(ev.RUN_COMPLETED, ev.RUN_FAILED, ev.RUN_CANCELLED)
def _ended(ctx: ApplyContext, e: RecordedEvent, d: dict[str, Any]) -> None:
    status = {ev.RUN_COMPLETED: "succeeded", ev.RUN_FAILED: "failed", ev.RUN_CANCELLED: "cancelled"}[e.type]
    _run(
        ctx,
        e,
        "status = %(status)s, finished_at = %(at)s, error = %(error)s, current_node = NULL",
        {"status": status, "error": d.get("error")},
    )


def _json(value: Any) -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb(value)

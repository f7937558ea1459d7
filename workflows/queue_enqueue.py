"""Putting nodes on the queue: a new run's first nodes with its events in one statement, and the
nodes a run queues again (a retry). Every function takes the caller's connection, so that the
queue change commits in the same transaction as the run-stream event that causes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from eventstore.spi import FloatArray, IntArray, TextArray
from workflows.node_spec import NodeSpec
from workflows.queries import Q

Conn = psycopg.Connection[Any]


def enqueue(
    conn: Conn,
    run_id: uuid.UUID,
    tenant: str,
    workflow: str,
    version: str,
    specs: Sequence[NodeSpec],
    *,
    attempts: Mapping[str, int] | None = None,
    delay: float = 0.0,
    reset_crashes: bool = False,
    priority: int | None = None,
) -> None:
    """Queue `specs` as ready; `attempts` gives the attempts each node already had in this run, `version`
    the version of the definition the run started with, `priority` the run's (None: the queue reads it
    from the run's RunStarted, migration 0028)."""
    if not specs:
        return
    attempts = attempts or {}
    conn.execute(
        Q["enqueue"],
        {
            "run_id": run_id,
            "tenant": tenant,
            "workflow": workflow,
            "version": version,
            **node_row_params(specs),
            "attempts": IntArray(attempts.get(s.name, 0) for s in specs),
            "delays": FloatArray(delay for _ in specs),
            "reset_crashes": reset_crashes,
            "priority": priority,
        },
    )


def node_row_params(specs: Sequence[NodeSpec], *, names: str = "nodes") -> dict[str, list[Any]]:
    """The queue row settings of `specs`, as the queue's statements take them (the names under `names`)."""
    return {
        names: TextArray(s.name for s in specs),
        "max_crashes": IntArray(s.max_crashes for s in specs),
        "progress_deadlines": FloatArray(s.progress_deadline for s in specs),
        "on_stuck": TextArray(s.on_stuck for s in specs),
    }


def start_run(
    conn: Conn,
    run_id: uuid.UUID,
    workflow: str,
    version: str,
    specs: Sequence[NodeSpec],
    append: Mapping[str, Any],
    *,
    priority: int = 0,
) -> list[tuple[Any, ...]]:
    """A new run's events (`append`: see `EventStore.one_stream_params`) and `specs` queued as ready, as
    one statement on an autocommit connection (see ledgerflow.wf_start_run); returns the append's rows."""
    return send_start_run(conn, run_id, workflow, version, specs, append, priority=priority).fetchall()


def send_start_run(
    conn: Conn,
    run_id: uuid.UUID,
    workflow: str,
    version: str,
    specs: Sequence[NodeSpec],
    append: Mapping[str, Any],
    *,
    priority: int = 0,
) -> psycopg.Cursor[Any]:
    """`start_run`'s statement, its answer not fetched: in a pipeline, fetched after the COMMIT went out
    with it, a start in a transaction costs one round trip."""
    params = {
        **append,
        "run_id": run_id,
        "workflow": workflow,
        "version": version,
        "priority": priority,
        **node_row_params(specs),
    }
    return conn.execute(Q["start_run"], params)

"""The run and node tables agree with the fold, field by field: for any valid histories of runs,
appended in any interleaving and projected by the real projector in batches of any size (so that runs
are loaded back from their rows between batches), every row holds what folding the run's stream in
Python gives. And the tables still equal their rebuild."""

from __future__ import annotations

import random
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from eventstore import ANY, EventStore, NewEvent
from projector import ProjectorWorker, WorkerSettings, failure_rows, verify
from tests.strategies import as_json_numbers, run_histories
from workflows import events as ev
from workflows import workflow_tables
from workflows.run_fold import fold
from workflows.run_state import RunState

# Fresh run ids: the runs of every example stay in the test's one database.
histories = st.lists(run_histories(run_ids=st.builds(uuid.uuid4)), min_size=1, max_size=3)


@given(
    runs=histories,
    tenants=st.lists(st.sampled_from(["default", "acme"]), min_size=3, max_size=3),
    batch_size=st.integers(1, 30),
    order=st.randoms(use_true_random=False),
)
@settings(max_examples=30)
def test_the_tables_hold_the_fold_of_every_run(
    store: EventStore,
    runs: list[tuple[uuid.UUID, list[NewEvent]]],
    tenants: list[str],
    batch_size: int,
    order: random.Random,
) -> None:
    tenant_of = {run_id: tenants[i] for i, (run_id, _) in enumerate(runs)}
    # A long lease: on a busy machine the appends between catch-ups must not outlast it (leases are
    # not what this test is about).
    config = WorkerSettings(lease_ttl=120, heartbeat_interval=30, batch_size=batch_size)
    worker = ProjectorWorker(store, [workflow_tables], config)
    try:
        _append_interleaved(store, runs, tenant_of, order, between=worker.run_until_caught_up)
        worker.run_until_caught_up()
    finally:
        worker.release_all()
    with store.pool.connection() as conn:
        assert not failure_rows.open_failures(conn, workflow_tables.name)
    for run_id, _ in runs:
        tenant = tenant_of[run_id]
        run = fold(run_id, tenant, store.read_stream(ev.run_stream(run_id), tenant=tenant))
        row, nodes = _rows(store, run_id)
        _assert_run_row(row, run)
        assert _tag_rows(store, run_id) == [
            (tenant, k, v, run.started_at) for k, v in sorted(run.tags.items())
        ]
        assert [n["node"] for n in nodes] == list(run.nodes)
        for n in nodes:
            _assert_node_row(n, run)
    assert verify(store, workflow_tables).equal


def _append_interleaved(
    store: EventStore,
    runs: list[tuple[uuid.UUID, list[NewEvent]]],
    tenant_of: dict[uuid.UUID, str],
    order: random.Random,
    between: Any,
) -> None:
    """Each run's events in order, in appends of one to three events, the runs interleaved; now and then
    the projector catches up in between (live incremental batches, not only one catch-up)."""
    # Chosen by index: the run ids are fresh each time, the choices must not depend on them.
    pending = {i: list(events) for i, (_, events) in enumerate(runs)}
    while pending:
        i = order.choice(sorted(pending))
        size = order.randint(1, 3)
        chunk, pending[i] = pending[i][:size], pending[i][size:]
        run_id = runs[i][0]
        store.append(ev.run_stream(run_id), chunk, expected_version=ANY, tenant=tenant_of[run_id])
        if not pending[i]:
            del pending[i]
        if order.random() < 0.2:
            between()


def _rows(store: EventStore, run_id: uuid.UUID) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        run = cur.execute("SELECT * FROM ledgerflow.workflow_runs WHERE run_id = %s", (run_id,)).fetchone()
        nodes = cur.execute(
            "SELECT * FROM ledgerflow.workflow_nodes WHERE run_id = %s ORDER BY position", (run_id,)
        ).fetchall()
    assert run is not None, f"no row for run {run_id}"
    return run, nodes


def _tag_rows(store: EventStore, run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    with store.pool.connection() as conn:
        return conn.execute(
            "SELECT tenant, key, value, created_at FROM ledgerflow.workflow_run_tags WHERE run_id = %s"
            " ORDER BY key",
            (run_id,),
        ).fetchall()


def _assert_run_row(row: dict[str, Any], run: RunState) -> None:
    expected = {
        "tenant": run.tenant,
        "workflow": run.workflow,
        "key": run.key,
        "status": run.status,
        "current_node": run.current_node,
        "nodes_total": len(run.nodes),
        "nodes_done": sum(1 for n in run.nodes.values() if n.status == "succeeded"),
        "input": as_json_numbers(run.input),
        "error": run.error,
        "cancel_requested": run.cancel_requested,
        "created_at": run.started_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "workflow_version": run.workflow_version,
        "tags": run.tags,
    }
    actual = {**{k: row[k] for k in expected}, "input": as_json_numbers(row["input"])}
    assert actual == expected


def _assert_node_row(row: dict[str, Any], run: RunState) -> None:
    n = run.nodes[row["node"]]
    current, total, message = n.progress if n.progress is not None else (None, None, None)
    expected = {
        "position": list(run.nodes).index(n.name),
        "status": str(n.status),
        "attempt": n.attempt,
        "crashes": n.crashes,
        "generation": n.generation,
        "progress_current": current,
        "progress_total": total,
        "progress_message": message,
        "checkpoints": len(n.checkpoints),  # each item is checkpointed once
        "worker": n.worker,
        "error": n.error,
        "stuck": n.stuck,
        "started_at": n.started_at,
        "finished_at": n.finished_at,
        "duration_ms": n.duration_ms,
        "updated_at": n.updated_at,
        "waiting_for": n.waiting_for,
        "wake_at": n.wake_at,
    }
    assert {k: row[k] for k in expected} == expected, f"node {n.name}"

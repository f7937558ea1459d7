"""The `workflow_tables` projection keeps every run's snapshot recent as it applies the run's events: after
it caught up, no run's snapshot is `LEDGERFLOW_RUN_SNAPSHOT_EVERY` versions or more behind the last event
the projection read of it, every snapshot is the fold of the events up to its version, and a first load
of a long run folds only what follows the snapshot."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import ANY, EventStore, NewEvent
from projector import ProjectorWorker, WorkerSettings
from tests.strategies import run_histories
from workflows import Engine, WorkflowRegistry, snapshots, workflow_tables
from workflows import event_codec as codec
from workflows import events as ev
from workflows.run_fold import fold

histories = run_histories(run_ids=st.builds(uuid.uuid4))


def snapshot_of(store: EventStore, run_id: uuid.UUID, tenant: str = "default") -> tuple[int, str] | None:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT version, state::text FROM ledgerflow.workflow_run_snapshots"
            " WHERE tenant = %s AND run_id = %s",
            (tenant, run_id),
        ).fetchone()
    return None if row is None else (row[0], row[1])


@contextmanager
def projecting(store: EventStore) -> Iterator[ProjectorWorker]:
    # One per example: a worker's lease lapses between hypothesis examples (no heartbeat runs there).
    worker = ProjectorWorker(store, [workflow_tables], WorkerSettings(lease_ttl=30, batch_size=7))
    try:
        yield worker
    finally:
        worker.release_all()


@given(
    history=histories,
    every=st.integers(1, 6),
    chunk=st.integers(1, 10),
    tenant=st.sampled_from(["default", "acme"]),
)
@settings(max_examples=30)
def test_the_projection_keeps_each_runs_snapshot_within_every_versions_of_what_it_read(
    store: EventStore,
    monkeypatch: pytest.MonkeyPatch,
    history: tuple[uuid.UUID, list[NewEvent]],
    every: int,
    chunk: int,
    tenant: str,
) -> None:
    monkeypatch.setenv("LEDGERFLOW_RUN_SNAPSHOT_EVERY", str(every))
    run_id, events = history
    stream = ev.run_stream(run_id)
    with projecting(store) as projector:
        for i in range(0, len(events), chunk):  # the stream grows between batches of the projection
            store.append(stream, events[i : i + chunk], expected_version=ANY, tenant=tenant)
            projector.run_until_caught_up()
    recorded = store.read_stream(stream, tenant=tenant, limit=10_000)
    tracked = set(workflow_tables.event_types or ())
    head = max(e.stream_version for e in recorded if e.type in tracked)
    found = snapshot_of(store, run_id, tenant)
    version = found[0] if found else 0
    assert head - version < every, f"snapshot at {version}, the projection read up to {head}"
    if found is not None:
        state = snapshots.from_json(run_id, tenant, found[1])
        assert state == fold(run_id, tenant, recorded[:version])


def test_a_long_runs_first_load_folds_only_what_follows_the_projections_snapshot(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERFLOW_RUN_SNAPSHOT_EVERY", "50")
    run_id = uuid.uuid4()
    head = [
        codec.event(
            ev.RUN_STARTED,
            run_id,
            workflow="wf",
            input={},
            input_fingerprint="fp",
            nodes=["work"],
            fingerprints={"work": "f"},
        ),
        codec.event(ev.NODES_READY, run_id, nodes=["work"]),
    ]
    body = [
        codec.event(ev.SIGNAL_RECEIVED, run_id, name="note", payload={"i": i})
        if i % 10 == 9
        else codec.event(ev.NODE_PROGRESS, run_id, node="work", current=i, total=1000)
        for i in range(998)
    ]
    store.append(ev.run_stream(run_id), [*head, *body], expected_version=ANY)
    with projecting(store) as projector:
        projector.run_until_caught_up()
    found = snapshot_of(store, run_id)
    assert found is not None
    assert found[0] > 1000 - 50
    # The load reads the snapshot and folds the rest: what it reads from the log is what follows.
    read: list[int] = []
    real = snapshots._fold_page

    def counting(conn, by_stream, upto):  # type: ignore[no-untyped-def]
        read.extend(run.version for run in by_stream.values())
        return real(conn, by_stream, upto)

    monkeypatch.setattr(snapshots, "_fold_page", counting)
    loaded = Engine(store, WorkflowRegistry()).load(run_id)
    assert read == [found[0]], "the load started from the projection's snapshot"
    assert loaded == fold(run_id, "default", store.read_stream(ev.run_stream(run_id), limit=10_000))

"""A run loaded from a snapshot is the run folded from its whole stream: for any valid history, a snapshot
taken at any version, written to the database and read back, with the rest of the stream folded onto it,
equals the fold of every event (signals by reference, as the fold keeps them). And `Engine.load`, which
writes and reads snapshots as it goes, agrees with the fold at every length of the stream."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import ANY, EventStore, NewEvent
from tests.flows import registry
from tests.strategies import run_histories
from workflows import Engine, RunCaps, snapshots
from workflows import events as ev
from workflows.run_fold import fold

histories = run_histories(run_ids=st.builds(uuid.uuid4))


@given(history=histories, cut=st.floats(0, 1), tenant=st.sampled_from(["default", "acme"]))
@settings(max_examples=40)
def test_fold_of_snapshot_and_rest_equals_fold_of_all(
    store: EventStore, history: tuple[uuid.UUID, list[NewEvent]], cut: float, tenant: str
) -> None:
    run_id, events = history
    store.append(ev.run_stream(run_id), events, expected_version=ANY, tenant=tenant)
    recorded = store.read_stream(ev.run_stream(run_id), tenant=tenant, limit=10_000)
    at = max(1, round(cut * len(recorded)))
    snapshot = fold(run_id, tenant, recorded[:at])
    snapshots.write(store, snapshot)
    loaded = snapshots.load_runs(store, [run_id], tenant=tenant, snapshot_every=10**6)[run_id]
    assert loaded == fold(run_id, tenant, recorded)
    # The JSON alone round-trips too.
    assert snapshots.from_json(run_id, tenant, snapshots.to_json(snapshot)) == snapshot


@given(history=histories, every=st.integers(1, 5))
@settings(max_examples=20)
def test_loads_that_write_snapshots_as_they_go_agree_with_the_fold(
    store: EventStore, history: tuple[uuid.UUID, list[NewEvent]], every: int
) -> None:
    run_id, events = history
    engine = Engine(store, registry, RunCaps(run_snapshot_every=every))
    for i in range(0, len(events), 3):  # the stream grows between loads
        store.append(ev.run_stream(run_id), events[i : i + 3], expected_version=ANY)
        recorded = store.read_stream(ev.run_stream(run_id), limit=10_000)
        assert engine.load(run_id) == fold(run_id, "default", recorded)
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT version FROM ledgerflow.workflow_run_snapshots WHERE run_id = %s", (run_id,)
        ).fetchone()
    if len(events) >= every:
        assert row is not None, "a load that folded enough events wrote a snapshot"

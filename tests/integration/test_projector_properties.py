"""Rebuild equals incremental: for random event sequences, batch sizes and interruptions, the live
projection and a full rebuild have equal digests, and no event was applied twice."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import EventStore, NewEvent
from projector import ProjectorWorker, WorkerSettings, rebuild
from projector.digest import projection_digest
from tests.projections import expire_leases, make_counter

# An action: append events to a stream, take a step with the current worker, or "crash" it (drop it
# without releasing its lease, so the next worker takes over only after the lease lapses).
appends = st.tuples(
    st.just("append"), st.integers(0, 4), st.lists(st.integers(-50, 50), min_size=1, max_size=6)
)
steps = st.tuples(st.just("step"), st.integers(1, 3), st.just([]))
crashes = st.tuples(st.just("crash"), st.just(0), st.just([]))
actions = st.lists(st.one_of(appends, steps, crashes), min_size=1, max_size=25)


#: One counter for every example (one schema, its tables created once): it goes on from the last example's
#: rebuild, and its applied table still covers the whole log. A counter per example cost a schema and its
#: tables, and a catch-up from the start over every earlier example's events, for nothing checked here:
#: the rebuild still reads the whole log from the start.
COUNTER = make_counter(name="properties_counter", schema="p_properties")


@given(actions=actions, batch_size=st.integers(1, 8))
@settings(max_examples=25)
def test_incremental_projection_equals_a_rebuild(
    store: EventStore, actions: list[tuple[str, int, list[int]]], batch_size: int
) -> None:
    counter, schema = COUNTER, COUNTER.schema
    prefix = f"s{uuid.uuid4().hex[:10]}"  # this example's streams
    config = WorkerSettings(lease_ttl=30, heartbeat_interval=10, batch_size=batch_size)
    worker = ProjectorWorker(store, [counter], config)
    try:
        for kind, n, amounts in actions:
            if kind == "append":
                store.append(f"{prefix}-{n}", [NewEvent("Add", {"amount": a}) for a in amounts])
            elif kind == "step":
                worker.acquire_free_leases()
                for _ in range(n):
                    worker.work_once()
            else:
                expire_leases(store, counter.name)
                worker = ProjectorWorker(store, [counter], config)
        worker.run_until_caught_up()
        with store.pool.connection() as conn:
            live = projection_digest(conn, counter, schema)
            applied = conn.execute(
                f'SELECT count(*), coalesce(max(times), 1) FROM "{schema}".applied'
            ).fetchone()
            in_log = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
        # Every event in the log (earlier examples' too: they share the database) applied exactly once.
        assert in_log is not None
        assert applied == (in_log[0], 1)
        assert rebuild(store, counter, batch_size=batch_size).digest == live
    finally:
        # The next example's worker takes the lease at once (a failing example must not hold it).
        worker.release_all()

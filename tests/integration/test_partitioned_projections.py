"""Partitioned projections: a projection in N segments equals its unpartitioned twin, whatever the
interleaving of appends, catch-up steps and crashes mid-batch; segments spread over live workers; a
changed N is refused until a rebuild."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import Cursor, EventStore, InvalidInputError, NewEvent
from projector import (
    PartitionsChangedError,
    Projection,
    ProjectorWorker,
    WorkerSettings,
    list_runs,
    projection_health,
    rebuild,
    replay,
    stream_segment,
    verify,
    wait_for,
)
from projector.digest import projection_digest
from tests.projections import CRASH_AFTER, Crash, make_counter
from tests.waiting import joined, wait_until

# An action: append events to a stream; let worker 0 or 1 take free segments and apply a few batches; or
# crash worker 0 or 1 in the middle of its next batch (after `n` events of it), leaving its leases to
# lapse and its batch rolled back, and start a new worker in its place.
appends = st.tuples(
    st.just("append"), st.integers(0, 9), st.lists(st.integers(-50, 50), min_size=1, max_size=6)
)
steps = st.tuples(st.sampled_from(["step0", "step1"]), st.integers(1, 3), st.just([]))
crashes = st.tuples(st.sampled_from(["crash0", "crash1"]), st.integers(0, 4), st.just([]))
actions = st.lists(st.one_of(appends, steps, crashes), min_size=1, max_size=25)


def _config(batch_size: int) -> WorkerSettings:
    return WorkerSettings(lease_ttl=30, heartbeat_interval=10, batch_size=batch_size, balance_interval=0)


def _abandon(store: EventStore, worker: ProjectorWorker) -> None:
    """What a SIGKILL leaves: the worker's leases held until they lapse (made to lapse now)."""
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE ledgerflow.projection_leases SET expires_at = clock_timestamp() WHERE owner = %s",
            (worker.id,),
        )


def _applied_once(store: EventStore, schema: str) -> None:
    with store.pool.connection() as conn:
        applied = conn.execute(f'SELECT count(*), coalesce(max(times), 1) FROM "{schema}".applied').fetchone()
        in_log = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert in_log is not None
    assert applied == (in_log[0], 1), "an event was missed or applied twice"


#: The unpartitioned twin, one for every example: it follows the log from one example to the next (each
#: example's final worker takes it up where the last one left it), so its digest is still that of the
#: whole log, as the new partitioned projection's is. A twin per example cost a schema and its tables,
#: and a catch-up from the start over the log of every example before it, for nothing the property checks.
TWIN = make_counter(name="partitioned_twin", schema="p_partitioned_twin")


@given(actions=actions, partitions=st.integers(1, 5), batch_size=st.integers(1, 8))
@settings(max_examples=30, deadline=None)
def test_partitioned_projection_equals_its_unpartitioned_twin(
    store: EventStore, actions: list[tuple[str, int, list[int]]], partitions: int, batch_size: int
) -> None:
    schema = f"p_{uuid.uuid4().hex[:10]}"
    partitioned = make_counter(name=schema, schema=schema, partitions=partitions)
    twin = TWIN
    config = _config(batch_size)
    workers = [ProjectorWorker(store, [partitioned], config) for _ in range(2)]
    final: ProjectorWorker | None = None
    crashes = 0
    try:
        for kind, n, amounts in actions:
            if kind == "append":
                store.append(f"{schema}-{n}", [NewEvent("Add", {"amount": a}) for a in amounts])
            elif kind.startswith("step"):
                for _ in range(n):
                    workers[int(kind[-1])].work_once()
            else:
                i = int(kind[-1])
                CRASH_AFTER[0] = n
                try:
                    for _ in range(3):
                        workers[i].work_once()
                except Crash:
                    crashes += 1
                finally:
                    CRASH_AFTER[0] = None
                _abandon(store, workers[i])
                workers[i] = ProjectorWorker(store, [partitioned], config)
        for worker in workers:
            _abandon(store, worker)
        final = ProjectorWorker(store, [partitioned, twin], config)
        final.run_until_caught_up()
        _applied_once(store, schema)
        _applied_once(store, twin.schema)
        with store.pool.connection() as conn:
            live = projection_digest(conn, partitioned, schema)
            assert live == projection_digest(conn, twin, twin.schema)
        assert verify(store, partitioned).equal
        assert rebuild(store, partitioned, batch_size=batch_size).digest == live
    finally:
        CRASH_AFTER[0] = None
        if final is not None:
            final.release_all()  # the next example's final worker takes the twin at once


@given(stream_id=st.text(min_size=0, max_size=40), partitions=st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_the_segment_of_a_stream_is_the_same_in_sql_and_python(
    store: EventStore, stream_id: str, partitions: int
) -> None:
    stream_id = stream_id.replace("\x00", "")  # PostgreSQL text holds no NUL
    with store.pool.connection() as conn:
        row = conn.execute("SELECT ledgerflow.stream_segment(%s, %s)", (stream_id, partitions)).fetchone()
    assert row is not None
    assert row[0] == stream_segment(stream_id, partitions)
    assert 0 <= row[0] < partitions


def test_segments_spread_the_streams(store: EventStore) -> None:
    counts = [0] * 4
    for i in range(400):
        counts[stream_segment(f"order-{i}", 4)] += 1
    assert min(counts) > 60, counts


def test_partitions_are_bounded() -> None:
    with pytest.raises(InvalidInputError, match="partitions=65"):
        make_counter(name="too_many", partitions=65)
    with pytest.raises(InvalidInputError, match="partitions=0"):
        make_counter(name="too_few", partitions=0)


@contextmanager
def _running(store: EventStore, projection: Projection, **settings: float) -> Iterator[ProjectorWorker]:
    config = WorkerSettings(batch_size=50, **settings)  # type: ignore[arg-type]
    worker = ProjectorWorker(store, [projection], config)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        joined(thread)


def _holding(worker: ProjectorWorker) -> set[str]:
    return {key for key in worker._leases if "#" in key}


def test_live_workers_share_the_segments(store: EventStore) -> None:
    counter = make_counter(name="shared_counter", schema="shared_counter", partitions=4)
    for i in range(40):
        store.append(f"s-{i}", [NewEvent("Add", {"amount": i})])
    with _running(store, counter, lease_ttl=2, heartbeat_interval=0.5) as first:
        wait_until(lambda: len(_holding(first)) == 4, timeout=30, what="one worker to hold every segment")
        with _running(store, counter, lease_ttl=2, heartbeat_interval=0.5) as second:
            # Two live workers: at most ceil(4 / 2) = 2 segments each, so the first hands two over.
            wait_until(
                lambda: len(_holding(first)) == 2 and len(_holding(second)) == 2,
                timeout=30,
                what="the segments to spread over both workers",
            )
            assert _holding(first).isdisjoint(_holding(second))
            appended = store.append("s-late", [NewEvent("Add", {"amount": 1})])
            wait_for(store, counter, appended, timeout=30)
            health = projection_health(store, [counter])[0]
            assert health.partitions == 4
            assert [g.segment for g in health.segments] == [0, 1, 2, 3]
            assert {g.owner for g in health.segments} == {first.id, second.id}
        # The second stopped and released its segments: the first takes them back.
        wait_until(lambda: len(_holding(first)) == 4, timeout=30, what="the first to take every segment back")
    _applied_once(store, counter.schema)
    with store.pool.connection() as conn:
        runs = list_runs(conn, counter.name, 100)
    assert {r.projection for r in runs if r.kind == "catch_up"} == {f"{counter.name}#{k}" for k in range(4)}


def test_a_changed_number_of_partitions_is_refused_until_rebuilt(store: EventStore) -> None:
    for i in range(30):
        store.append(f"c-{i}", [NewEvent("Add", {"amount": i})])
    before = make_counter(name="resized", schema="resized", partitions=2)
    worker = ProjectorWorker(store, [before], _config(10))
    worker.run_until_caught_up()
    worker.release_all()

    after = make_counter(name="resized", schema="resized", partitions=3)
    refused = ProjectorWorker(store, [after], _config(10))
    with pytest.raises(TimeoutError):
        refused.run_until_caught_up(timeout=1)
    assert not refused._runners, "no segment runs with the stored number of partitions"
    with pytest.raises(PartitionsChangedError, match="ledgerflow projections rebuild resized"):
        verify(store, after)

    rebuild(store, after)
    store.append("c-new", [NewEvent("Add", {"amount": 5})])
    rebuilt = ProjectorWorker(store, [after], _config(10))
    rebuilt.run_until_caught_up()
    _applied_once(store, after.schema)
    assert verify(store, after).equal
    assert sorted(rebuilt._runners) == [f"resized#{k}" for k in range(3)]
    rebuilt.release_all()


def test_a_partitioned_projection_is_replayed_by_a_rebuild(store: EventStore) -> None:
    counter = make_counter(name="replayed", schema="replayed", partitions=3)
    first = store.append("r-1", [NewEvent("Add", {"amount": 1})])
    store.append("r-2", [NewEvent("Add", {"amount": 2})])
    worker = ProjectorWorker(store, [counter], _config(10))
    worker.run_until_caught_up()
    # A partitioned projection is replayed by a rebuild, which gives the state a replay would.
    e = first.events[0]
    run_id = replay(store, counter, after=Cursor(e.transaction_id, e.position))
    with store.pool.connection() as conn:
        kinds = {r.id: r.kind for r in list_runs(conn, counter.name, 10)}
    assert kinds[run_id] == "rebuild"
    worker.run_until_caught_up()
    _applied_once(store, counter.schema)
    worker.release_all()

"""Reading one's own writes: `projector.wait_for` returns once a projection shows an append, every time,
and says clearly when it does not in time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import Cursor, EventStore, NewEvent
from projector import ProjectionBehindError, ProjectorWorker, WorkerSettings, stream_catalogue, wait_for
from tests.projections import make_counter

FAST = WorkerSettings(lease_ttl=5, heartbeat_interval=1, batch_size=50, poll_interval=5)


@pytest.fixture
def projector(store: EventStore) -> Iterator[ProjectorWorker]:
    """A projector worker for the counter and the catalogue, running in a thread (its poll interval is
    long: it follows appends by their notifications)."""
    worker = ProjectorWorker(store, [make_counter(), stream_catalogue], FAST)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    yield worker
    worker.stop()
    thread.join(10)


def count_of(store: EventStore, stream_id: str) -> int:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT n FROM ledgerflow.counts WHERE stream_id = %s", (stream_id,)).fetchone()
    return 0 if row is None else int(row[0])


def test_every_append_is_seen_by_the_next_read(store: EventStore, projector: ProjectorWorker) -> None:
    counter = projector.projections["test_counter"]
    expected: dict[str, int] = {}
    for i in range(200):
        stream = f"ryw-{i % 7}"
        result = store.append(stream, [NewEvent("Add", {"amount": 1})])
        expected[stream] = expected.get(stream, 0) + 1
        at = wait_for(store, counter, result, timeout=10)
        assert at >= Cursor(result.events[0].transaction_id, result.events[0].position)
        assert count_of(store, stream) == expected[stream]


@settings(max_examples=40)  # each example waits for a real projector: kept short for the suite
@given(batches=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=8))
def test_a_read_after_waiting_shows_every_event_appended(
    store: EventStore, projector: ProjectorWorker, batches: list[int]
) -> None:
    counter = projector.projections["test_counter"]
    stream = f"prop-{time.monotonic_ns()}"
    for n in batches:
        result = store.append(stream, [NewEvent("Add", {"amount": 1}) for _ in range(n)])
    wait_for(store, counter, result, timeout=10)
    assert count_of(store, stream) == sum(batches)


def test_a_projection_that_does_not_read_the_type_has_passed_it(store: EventStore) -> None:
    # No projector runs: the counter's cursor never moves; yet it has nothing to apply up to this write.
    only_adds = make_counter()
    only_adds.event_types = ["Add"]
    ProjectorWorker(store, [only_adds], FAST).run_until_caught_up()
    result = store.append("other-1", [NewEvent("Unrelated", {})])
    assert wait_for(store, only_adds, result, timeout=5) < Cursor(
        result.events[0].transaction_id, result.events[0].position
    )


def test_the_timeout_names_the_projection_its_position_and_the_cursor(store: EventStore) -> None:
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    worker.run_until_caught_up()
    worker.release_all()
    result = store.append("late-1", [NewEvent("Add", {"amount": 1})])
    began = time.monotonic()
    with pytest.raises(ProjectionBehindError) as caught:
        wait_for(store, counter, result, timeout=0.3)
    # At least the timeout; the upper bound only has to tell it from waiting on (margin for load).
    assert 0.3 <= time.monotonic() - began < 10
    details = caught.value.details()
    assert details["projection"] == "test_counter"
    assert details["min_cursor"] == str(Cursor(result.events[0].transaction_id, result.events[0].position))
    assert Cursor.parse(details["position"]) < Cursor.parse(details["min_cursor"])
    assert isinstance(caught.value, TimeoutError)


def test_the_committed_so_far_cursor_is_waited_for_not_refused(store: EventStore) -> None:
    """An existing run's start answers with `committed_so_far()`; with the projection behind and no
    transaction begun since, that cursor was refused as lying beyond every write (a 422 under load)."""
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    worker.run_until_caught_up()
    worker.release_all()
    late = store.append("late-2", [NewEvent("Add", {"amount": 1})]).events[0]
    # The case that was refused: no transaction began anywhere in the cluster between the call and the
    # wait. Other tests' transactions share the cluster's ids, so the quiet moment is looked for; when
    # another transaction did begin, the cursor lies below a write and the same answers must hold.
    now = store.committed_so_far()
    for _ in range(20):
        again = store.committed_so_far()
        if again == now:
            break
        now = again
    with pytest.raises(ProjectionBehindError):
        wait_for(store, counter, now, timeout=0)
    worker.run_until_caught_up()
    # Passed: the projection applied the append. The cursor it returns is the projection's row, which
    # stays at the append while transactions of other tests (they share the cluster's ids) move `now`
    # further: it is at least the append's, not always `now`.
    assert wait_for(store, counter, now, timeout=5) >= Cursor(late.transaction_id, late.position)
    assert count_of(store, "late-2") == 1


def test_a_projection_of_every_type_passes_ids_taken_by_other_transactions(store: EventStore) -> None:
    """A projection that reads every event type, idle and caught up, shows "now" at once, although
    transactions that append nothing (here, three on another connection; another database's or a lease's
    renewal are such too) took ids since its last event: its cursor row stays at that event while it is
    idle, and the waiter reads the horizon from there. Before, the waiter looked at the cursor row alone
    and waited for an append."""
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    appended = store.append("quiet-1", [NewEvent("Add", {"amount": 1})])
    worker.run_until_caught_up()
    with psycopg.connect(store.url, autocommit=True) as other:
        for _ in range(3):
            other.execute("SELECT pg_current_xact_id()")  # a transaction with an id, writing no event
    now = store.committed_so_far()
    worker.run_until_caught_up()
    worker.release_all()
    # Passed at once; the cursor it returns is the projection's row, which stayed at the event.
    event = appended.events[0]
    assert wait_for(store, counter, now, timeout=2) >= Cursor(event.transaction_id, event.position)
    assert count_of(store, "quiet-1") == 1


def test_a_waiter_wakes_when_the_projector_commits(store: EventStore) -> None:
    """The waiter is woken by the cursor's advance, not by its own periodic look."""
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    worker.run_until_caught_up()
    result = store.append("wake-1", [NewEvent("Add", {"amount": 1})])
    waited: list[float] = []

    def waiter() -> None:
        began = time.monotonic()
        wait_for(store, counter, result, timeout=30)
        waited.append(time.monotonic() - began)

    thread = threading.Thread(target=waiter)
    thread.start()
    worker.run_until_caught_up()
    thread.join(30)
    worker.release_all()
    assert waited
    assert waited[0] < 5
    assert count_of(store, "wake-1") == 1

"""Failures are kept, not lost: retried with backoff, recorded, blocking or parked, then retried or
skipped by an operator, and a skip is itself recorded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eventstore import EventStore, NewEvent
from projector import (
    ProjectorWorker,
    RetrySettings,
    WorkerSettings,
    cursor_rows,
    failure_rows,
    rebuild,
    run_rows,
)
from projector.digest import projection_digest
from tests.projections import POISONED, make_counter

SETTINGS = WorkerSettings(
    lease_ttl=5,
    heartbeat_interval=1,
    batch_size=10,
    retry=RetrySettings(attempts=3, initial_backoff=0.001, max_backoff=0.01),
)


@pytest.fixture(autouse=True)
def clean_poison() -> Iterator[None]:
    POISONED.clear()
    yield
    POISONED.clear()


def counts(store: EventStore) -> dict[str, int]:
    with store.pool.connection() as conn:
        return {r[0]: r[1] for r in conn.execute("SELECT stream_id, n FROM ledgerflow.counts").fetchall()}


def failures(store: EventStore, projection: str) -> list[failure_rows.Failure]:
    with store.pool.connection() as conn:
        return failure_rows.list_failures(conn, projection, include_closed=True)


def seed(store: EventStore) -> None:
    store.append(
        "a",
        [NewEvent("Add", {"amount": 1}), NewEvent("Add", {"poison": "p1"}), NewEvent("Add", {"amount": 1})],
    )
    store.append("b", [NewEvent("Add", {"amount": 1}), NewEvent("Add", {"amount": 1})])


def test_a_failing_event_blocks_the_projection_until_retried(store: EventStore) -> None:
    POISONED.add("p1")
    seed(store)
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.run_until_caught_up()
    (failure,) = failures(store, counter.name)
    assert (failure.status, failure.attempts, failure.stream_version) == ("open", 3, 2)
    assert failure.error_class == "builtins.ValueError"
    assert "poisoned event p1" in failure.error_message
    assert counts(store) == {"a": 1}  # blocked right before the failing event

    with store.pool.connection() as conn:
        assert failure_rows.request_failure_retry(conn, failure.id, "tester")
    POISONED.clear()
    worker.run_until_caught_up()
    assert counts(store) == {"a": 3, "b": 2}
    (failure,) = failures(store, counter.name)
    assert failure.status == "resolved"
    worker.release_all()


def test_a_retry_that_fails_again_blocks_again(store: EventStore) -> None:
    POISONED.add("p1")
    seed(store)
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        failure_rows.request_failure_retry(conn, failures(store, counter.name)[0].id, "tester")
    worker.run_until_caught_up()
    (failure,) = failures(store, counter.name)
    assert (failure.status, failure.attempts) == ("open", 6)
    worker.release_all()


def test_skip_is_recorded_and_the_projection_goes_on(store: EventStore) -> None:
    POISONED.add("p1")
    seed(store)
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        assert failure_rows.request_failure_skip(conn, failures(store, counter.name)[0].id, "operator-ann")
    worker.run_until_caught_up()
    assert counts(store) == {"a": 2, "b": 2}
    (failure,) = failures(store, counter.name)
    assert (failure.status, failure.resolved_by) == ("skipped", "operator-ann")
    assert failure.resolved_at is not None
    # A rebuild skips the same event, so it equals the incremental state.
    with store.pool.connection() as conn:
        live = projection_digest(conn, counter, counter.schema)
    assert rebuild(store, counter).digest == live
    worker.release_all()


def test_park_policy_holds_back_only_the_failing_stream(store: EventStore) -> None:
    POISONED.add("p1")
    seed(store)
    counter = make_counter("test_parking", policy="park")
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.run_until_caught_up()
    assert counts(store) == {"a": 1, "b": 2}  # stream b went on
    store.append("a", [NewEvent("Add", {"amount": 1})])
    store.append("b", [NewEvent("Add", {"amount": 1})])
    worker.run_until_caught_up()
    assert counts(store) == {"a": 1, "b": 3}  # a stays parked behind its failure

    with store.pool.connection() as conn:
        live = projection_digest(conn, counter, counter.schema)
    assert rebuild(store, counter).digest == live  # the rebuild parks the same events

    POISONED.clear()
    with store.pool.connection() as conn:
        failure_rows.request_failure_retry(conn, failures(store, counter.name)[0].id, "tester")
    worker.run_until_caught_up()
    assert counts(store) == {"a": 4, "b": 3}
    assert failures(store, counter.name)[0].status == "resolved"
    with store.pool.connection() as conn:
        assert conn.execute("SELECT max(times) FROM ledgerflow.applied").fetchone() == (1,)
    worker.release_all()


def test_skipping_a_parked_failure_applies_the_rest_of_its_stream(store: EventStore) -> None:
    POISONED.add("p1")
    seed(store)
    counter = make_counter("test_parking", policy="park")
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        failure_rows.request_failure_skip(conn, failures(store, counter.name)[0].id, "tester")
    worker.run_until_caught_up()
    assert counts(store) == {"a": 2, "b": 2}
    assert failures(store, counter.name)[0].status == "skipped"
    worker.release_all()


def test_a_run_whose_owner_stopped_heartbeating_is_marked_abandoned(store: EventStore) -> None:
    store.append("s", [NewEvent("Add", {"amount": 1})])
    counter = make_counter()
    with store.pool.connection() as conn:
        cursor_rows.ensure_cursor(conn, counter.name, 1)
        run_id = run_rows.start_run(
            conn,
            counter.name,
            "rebuild",
            trigger="test",
            actor="t",
            owner="dead-host:1",
            start=cursor_rows.get_cursor(conn, counter.name).cursor,
        )  # type: ignore[union-attr]
        conn.execute("UPDATE ledgerflow.projection_runs SET heartbeat_at = now() - interval '1 hour'")
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.heartbeat()
    with store.pool.connection() as conn:
        run = run_rows.get_run(conn, run_id)
    assert run is not None
    assert run.status == "abandoned"
    assert "dead-host:1 stopped heartbeating" in (run.error or "")
    # The projection is not held back by the dead run: a new rebuild can start.
    assert rebuild(store, counter).events == 1

"""Leases between workers: one holder at a time, exactly one takes over a lapsed lease, and a worker
that lost its lease cannot commit (fencing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from eventstore import EventStore, NewEvent
from projector import LeaseLost, ProjectorWorker, WorkerSettings, lease_rows, run_rows
from projector.projection import Projection
from projector.runner import LiveRunner
from tests.projections import make_counter
from tests.waiting import joined, wait_until

T = TypeVar("T")

SETTINGS = WorkerSettings(lease_ttl=30, heartbeat_interval=10, batch_size=5)


def expire(store: EventStore, projection: str) -> None:
    """What a paused worker looks like from outside: its lease lapsed."""
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE ledgerflow.projection_leases SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE projection = %s",
            (projection,),
        )


def test_one_worker_holds_a_projection_and_exactly_one_takes_over(store: EventStore) -> None:
    counter = make_counter()
    first = ProjectorWorker(store, [counter], SETTINGS)
    first.acquire_free_leases()
    others = [ProjectorWorker(store, [counter], SETTINGS) for _ in range(4)]
    for w in others:
        w.acquire_free_leases()
    assert [len(w._runners) for w in [first, *others]] == [1, 0, 0, 0, 0]

    expire(store, counter.name)
    barrier = threading.Barrier(len(others), timeout=60)

    def race(worker: ProjectorWorker) -> None:
        barrier.wait()
        worker.acquire_free_leases()

    threads = [threading.Thread(target=race, args=(w,)) for w in others]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    winners = [w for w in others if w._runners]
    assert len(winners) == 1
    assert winners[0]._runners[counter.name].epoch == 2


def test_a_worker_that_lost_its_lease_cannot_commit(store: EventStore) -> None:
    counter = make_counter()
    for i in range(10):
        store.append("s", [NewEvent("Add", {"amount": i})])
    stale = ProjectorWorker(store, [counter], SETTINGS)
    stale.acquire_free_leases()
    stale_runner: LiveRunner = stale._runners[counter.name]
    stale_runner.step()  # applies the first batch of 5

    expire(store, counter.name)
    fresh = ProjectorWorker(store, [counter], SETTINGS)
    fresh.run_until_caught_up()

    store.append("s", [NewEvent("Add", {"amount": 100})])
    with pytest.raises(LeaseLost):
        stale_runner.step()
    with store.pool.connection() as conn:
        assert conn.execute("SELECT max(times), count(*) FROM ledgerflow.applied").fetchone() == (1, 10)
    fresh.run_until_caught_up()
    with store.pool.connection() as conn:
        assert conn.execute("SELECT max(times), count(*) FROM ledgerflow.applied").fetchone() == (1, 11)


def test_release_lets_another_worker_take_over_at_once(store: EventStore) -> None:
    counter = make_counter()
    first = ProjectorWorker(store, [counter], SETTINGS)
    first.acquire_free_leases()
    first.release_all()
    second = ProjectorWorker(store, [counter], SETTINGS)
    second.acquire_free_leases()
    assert counter.name in second._runners
    with store.pool.connection() as conn:
        runs = run_rows.list_runs(conn, counter.name)
    # The first worker's catch-up run ended as stopped when it let go, not left running.
    assert [(r.owner, r.status) for r in runs] == [(second.id, "running"), (first.id, "stopped")]


def test_heartbeat_notices_a_lost_lease(store: EventStore) -> None:
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], SETTINGS)
    worker.acquire_free_leases()
    expire(store, counter.name)
    ProjectorWorker(store, [counter], SETTINGS).acquire_free_leases()
    worker.heartbeat()
    assert worker._runners == {}


def _calls(
    record: list[object], fn: Callable[..., T], what: Callable[..., object] = lambda *a: None
) -> Callable[..., T]:
    """`fn`, which also notes `what(*args)` in `record` at every call (the real call still runs)."""

    def counted(*args: Any) -> T:
        record.append(what(*args))
        return fn(*args)

    return counted


def _lease_held_elsewhere(
    store: EventStore, monkeypatch: pytest.MonkeyPatch, poll_interval: float
) -> tuple[Projection, ProjectorWorker, ProjectorWorker, list[object]]:
    """A counter projection whose lease `holder` holds, a `waiting` worker for the same projection, and the
    owners that asked the database for a lease from then on, in order."""
    counter = make_counter()
    holder = ProjectorWorker(store, [counter], SETTINGS)
    holder.acquire_free_leases()
    asks: list[object] = []

    def owner(conn: Any, projection: str, owner: str, ttl: float) -> str:
        return owner

    monkeypatch.setattr(lease_rows, "acquire_lease", _calls(asks, lease_rows.acquire_lease, owner))
    settings = WorkerSettings(lease_ttl=30, heartbeat_interval=10, poll_interval=poll_interval)
    return counter, holder, ProjectorWorker(store, [counter], settings), asks


def test_a_worker_refused_a_lease_asks_again_once_per_poll_interval_not_at_every_wake(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter, holder, waiting, asks = _lease_held_elsewhere(store, monkeypatch, poll_interval=1)
    began = time.monotonic()
    for _ in range(50):
        waiting.work_once()  # what the loop does at every wake
    assert asks.count(waiting.id) == 1
    holder.release_all()

    # Released: taken at the next look, within the poll interval.
    def taken() -> bool:
        waiting.work_once()
        return counter.name in waiting._runners

    wait_until(taken, timeout=10, what="the released lease to be taken")
    assert time.monotonic() - began >= 1.0
    assert asks.count(waiting.id) == 2
    # And a direct call asks at once, as before (tests, one-shot catch-ups).
    assert not waiting.acquire_free_leases()


def test_a_running_worker_that_holds_nothing_costs_the_database_nothing_per_append(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, waiting, asks = _lease_held_elsewhere(store, monkeypatch, poll_interval=5)
    looks: list[object] = []
    horizon_checks: list[object] = []
    monkeypatch.setattr(waiting, "work_once", _calls(looks, waiting.work_once))
    monkeypatch.setattr(store, "events_beyond_horizon", _calls(horizon_checks, store.events_beyond_horizon))
    thread = threading.Thread(target=waiting.run, daemon=True)
    thread.start()
    try:
        # Every append wakes the loop: append until it has gone round ten times.
        def woken_ten_times() -> bool:
            store.append("s", [NewEvent("Add", {"amount": 1})])
            return len(looks) >= 10

        wait_until(woken_ten_times, timeout=30, what="the loop to wake ten times")
    finally:
        waiting.stop()
        joined(thread)
    assert asks.count(waiting.id) == 1, asks
    assert horizon_checks == []

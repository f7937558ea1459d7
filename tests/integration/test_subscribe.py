"""Subscriptions: woken by LISTEN/NOTIFY, polling as a fallback, and nothing lost across reconnects."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import psycopg
import pytest

from eventstore import EventStore, NewEvent, RecordedEvent, Subscription

WAIT = 10.0


class Follower:
    """Runs a subscription in a thread and hands its events over through a queue."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.events: queue.Queue[RecordedEvent] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for event in self.subscription:
            self.events.put(event)

    def take(self, n: int) -> list[RecordedEvent]:
        return [self.events.get(timeout=WAIT) for _ in range(n)]

    def stop(self) -> None:
        self.subscription.stop()
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive()


@pytest.fixture
def follow(store: EventStore) -> Iterator[type[Follower]]:
    started: list[Follower] = []

    class Tracked(Follower):
        def __init__(self, subscription: Subscription) -> None:
            super().__init__(subscription)
            started.append(self)

    yield Tracked
    for follower in started:
        follower.stop()


def test_subscription_catches_up_then_follows(store: EventStore, follow: type[Follower]) -> None:
    store.append("s", [NewEvent("Old", {"i": 0})])
    # A long poll interval: only the wake-up can deliver the new events in time.
    follower = follow(store.subscribe(poll_interval=60))
    assert [e.type for e in follower.take(1)] == ["Old"]
    store.append("s", [NewEvent("New", {"i": 1}), NewEvent("New", {"i": 2})])
    assert [e.data["i"] for e in follower.take(2)] == [1, 2]


def test_polling_delivers_when_no_wake_up_is_sent(store: EventStore, follow: type[Follower]) -> None:
    silent = EventStore(store.pool, url=store.url)  # no notifier: appends wake nobody
    follower = follow(store.subscribe(poll_interval=0.05))
    silent.append("s", [NewEvent("Quiet", {})])
    assert [e.type for e in follower.take(1)] == ["Quiet"]


def test_dropped_listener_connection_loses_nothing(store: EventStore, follow: type[Follower]) -> None:
    follower = follow(store.subscribe(poll_interval=60))
    store.append("s", [NewEvent("Before", {})])
    assert [e.type for e in follower.take(1)] == ["Before"]
    with psycopg.connect(store.url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'ledgerflow-subscriber' AND datname = current_database()"
        ).fetchone()
    assert killed == (1,)
    # Appended while the subscriber may be disconnected: its wake-up can be lost, the event cannot.
    store.append("s", [NewEvent("During", {})])
    store.append("s", [NewEvent("After", {})])
    assert [e.type for e in follower.take(2)] == ["During", "After"]


def test_subscription_filters_and_resumes_from_its_cursor(store: EventStore, follow: type[Follower]) -> None:
    store.append("order-1", [NewEvent("Placed", {"n": 1})])
    store.append("user-1", [NewEvent("Joined", {})])
    first = follow(store.subscribe(categories=["order"], poll_interval=60))
    assert [e.data["n"] for e in first.take(1)] == [1]
    first.stop()
    store.append("order-2", [NewEvent("Placed", {"n": 2})])
    resumed = follow(store.subscribe(first.subscription.cursor, categories=["order"], poll_interval=60))
    assert [e.data["n"] for e in resumed.take(1)] == [2]
    assert resumed.events.empty()

"""Appends wake listeners through the notifier, which outlives the loss of its connection."""

from __future__ import annotations

import psycopg

from eventstore import DatabaseSettings, EventStore, NewEvent, open_store
from tests.waiting import wait_until


def woken(listener: psycopg.Connection[object], timeout: float) -> bool:
    return any(n.channel == "ledgerflow_events" for n in listener.notifies(timeout=timeout, stop_after=1))


def test_an_append_wakes_every_listener(store: EventStore) -> None:
    with psycopg.connect(store.url, autocommit=True) as listener:
        listener.execute("LISTEN ledgerflow_events")
        store.append("s", [NewEvent("Happened", {})])
        assert woken(listener, timeout=10)


def test_every_append_of_a_quick_succession_is_followed_by_a_wake_up(store: EventStore) -> None:
    """The wake-ups are coalesced, yet the last append's comes after its commit: a listener woken by the
    first append's wake-up, and reading then, may find nothing of the later ones, so they need one more."""
    with psycopg.connect(store.url, autocommit=True) as listener:
        listener.execute("LISTEN ledgerflow_events")
        for _ in range(3):
            store.append("s", [NewEvent("Happened", {})])
            assert woken(listener, timeout=10)
            # Right after another's wake-up: within the interval that coalesces them (most likely).
            store.append("s", [NewEvent("Happened", {})])
            store.append("s", [NewEvent("Happened", {})])
            assert woken(listener, timeout=10)
            while woken(listener, timeout=0.05):
                pass


def test_the_notifier_reconnects_after_its_backend_is_terminated(store: EventStore) -> None:
    with psycopg.connect(store.url, autocommit=True) as listener:
        listener.execute("LISTEN ledgerflow_events")
        store.append("s", [NewEvent("Happened", {})])
        assert woken(listener, timeout=10)
        ended = listener.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'ledgerflow-notifier'"
        ).fetchone()
        assert ended == (1,)

        def append_and_hear() -> bool:
            store.append("s", [NewEvent("Happened", {})])
            return woken(listener, timeout=0.2)

        wait_until(append_and_hear, what="a wake-up through the notifier's new connection")


def _notifier_sessions(conn: psycopg.Connection[object]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'ledgerflow-notifier'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_idle_notifier_gives_its_server_slot_back_and_wakes_listeners_again(database_url: str) -> None:
    """An idle notifier holds no connection: kept for good, the idle notifiers of a fleet once held the
    slots of a full server that every process's pool waited for. The next append opens one again."""
    settings = DatabaseSettings(database_url=database_url, pool_max_idle=0.2)
    with (
        open_store(settings, url=database_url, migrate=False) as store,
        psycopg.connect(database_url, autocommit=True) as listener,
    ):
        listener.execute("LISTEN ledgerflow_events")
        for _ in range(2):
            store.append("s", [NewEvent("Happened", {})])
            assert woken(listener, timeout=10)  # sent on the notifier's connection, opened again
            wait_until(
                lambda: _notifier_sessions(listener) == 0, what="the idle notifier to close its connection"
            )

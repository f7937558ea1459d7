"""Appends wake listeners: the appender sends the wake-up itself when one is due, the notifier's thread
sends the one due for appends that came within the interval after it; the thread outlives the loss of its
connection."""

from __future__ import annotations

import psycopg

from eventstore import EventStore, NewEvent
from eventstore.notify import Notifier
from tests.waiting import wait_until


def woken(listener: psycopg.Connection[object], timeout: float) -> bool:
    return any(n.channel == "ledgerflow_events" for n in listener.notifies(timeout=timeout, stop_after=1))


def test_an_append_wakes_every_listener(store: EventStore) -> None:
    with psycopg.connect(store.url, autocommit=True) as listener:
        listener.execute("LISTEN ledgerflow_events")
        store.append("s", [NewEvent("Happened", {})])
        assert woken(listener, timeout=10)


def test_every_append_of_a_quick_succession_is_followed_by_a_wake_up(store: EventStore) -> None:
    """Whichever sends it, the last append's wake-up comes after its commit: a listener woken by the first
    append's wake-up and then reading finds nothing yet of the second, so it needs one more."""
    with psycopg.connect(store.url, autocommit=True) as listener:
        listener.execute("LISTEN ledgerflow_events")
        for _ in range(3):
            store.append("s", [NewEvent("Happened", {})])
            assert woken(listener, timeout=10)
            # Right after another's wake-up: within the interval (most likely), so the thread's to send.
            store.append("s", [NewEvent("Happened", {})])
            store.append("s", [NewEvent("Happened", {})])
            assert woken(listener, timeout=10)
            while woken(listener, timeout=0.05):
                pass


def test_a_wake_up_claimed_and_not_sent_is_sent_by_the_thread_for_a_later_append(store: EventStore) -> None:
    """An appender that claimed the due wake-up covers only what committed before it; an append that
    pokes afterwards is announced by the thread, within the interval, with no appender sending anything."""
    notifier = Notifier(store.url)
    try:
        with psycopg.connect(store.url, autocommit=True) as listener:
            listener.execute("LISTEN ledgerflow_events")
            assert notifier.claim()
            notifier.poke()
            assert woken(listener, timeout=10)
    finally:
        notifier.close()


def test_the_wake_up_on_the_appenders_connection_leaves_nothing_set(store: EventStore) -> None:
    store.append("s", [NewEvent("Happened", {})])
    with store.statement_connection() as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
    with psycopg.connect(store.url, autocommit=True) as other:
        assert row == other.execute("SELECT current_setting('synchronous_commit')").fetchone()


def test_the_notifier_reconnects_after_its_backend_is_terminated(store: EventStore) -> None:
    # The notifier's thread alone (appends also send wake-ups on their own connections, which would
    # wake the listener whatever became of the thread's).
    notifier = Notifier(store.url)
    try:
        with psycopg.connect(store.url, autocommit=True) as listener:
            listener.execute("LISTEN ledgerflow_events")
            notifier.poke()
            assert woken(listener, timeout=10)
            ended = listener.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'ledgerflow-notifier'"
            ).fetchone()
            assert ended == (1,)

            def poke_and_hear() -> bool:
                notifier.poke()
                return woken(listener, timeout=0.2)

            wait_until(poke_and_hear, what="a wake-up through the notifier's new connection")
    finally:
        notifier.close()

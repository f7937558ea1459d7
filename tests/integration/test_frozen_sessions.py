"""A worker's heartbeat ends the sessions of frozen processes of its kind that sit in a transaction past
a lease, whatever the protocol state that kept the server's idle timeout from firing; others are left."""

from __future__ import annotations

import psycopg

from eventstore import EventStore
from eventstore.frozen import end_frozen_sessions
from tests.waiting import wait_until


def session(url: str, application: str) -> psycopg.Connection[tuple[object, ...]]:
    # No idle timeout: as if a protocol Flush had disarmed it.
    return psycopg.connect(
        url, autocommit=True, application_name=application, options="-c idle_in_transaction_session_timeout=0"
    )


def test_frozen_sessions_of_the_same_kind_are_ended_and_release_their_locks(store: EventStore) -> None:
    with psycopg.connect(store.url, autocommit=True) as setup:
        setup.execute("CREATE TABLE frozen_probe (id int PRIMARY KEY)")
        setup.execute("INSERT INTO frozen_probe VALUES (1)")
    frozen = session(store.url, "ledgerflow-projector")
    other_kind = session(store.url, "ledgerflow-worker")
    try:
        frozen.execute("BEGIN")
        frozen.execute("SELECT id FROM frozen_probe WHERE id = 1 FOR UPDATE")
        other_kind.execute("BEGIN")
        other_kind.execute("SELECT 1")
        with session(store.url, "ledgerflow-projector") as reaper:
            assert end_frozen_sessions(reaper, older_than=60) == 0, "not frozen for a lease yet"
            ended = wait_until(
                lambda: end_frozen_sessions(reaper, older_than=0.3), timeout=10, what="the session to end"
            )
            assert ended == 1
            free = reaper.execute("SELECT id FROM frozen_probe FOR UPDATE SKIP LOCKED").fetchall()
            assert free == [(1,)], "its row lock went with it"
        assert other_kind.execute("SELECT 2").fetchone() == (2,), "another kind of worker is left alone"
    finally:
        frozen.close()
        other_kind.close()


def test_a_session_stuck_writing_to_a_frozen_client_inside_a_transaction_is_ended(store: EventStore) -> None:
    """A frozen client stops reading: a transaction's answer larger than the socket buffers leaves the
    server blocked writing it ("active", ClientWrite), its row locks held, where no idle timeout applies."""
    with psycopg.connect(store.url, autocommit=True) as setup:
        setup.execute("CREATE TABLE frozen_probe (id int PRIMARY KEY)")
        setup.execute("INSERT INTO frozen_probe VALUES (1)")
    frozen = session(store.url, "ledgerflow-worker")
    try:
        # Sent, never read: about 200 MB of answer after the row lock.
        frozen.pgconn.send_query(
            b"BEGIN; SELECT id FROM frozen_probe WHERE id = 1 FOR UPDATE;"
            b" SELECT repeat('x', 10000) FROM generate_series(1, 20000)"
        )
        pid = frozen.pgconn.backend_pid
        with session(store.url, "ledgerflow-worker") as reaper:

            def writing() -> bool:
                row = reaper.execute(
                    "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                return row == ("ClientWrite",)

            wait_until(writing, timeout=30, what="the server to block writing to the frozen client")
            ended = wait_until(
                lambda: end_frozen_sessions(reaper, older_than=0.3), timeout=10, what="the session to end"
            )
            assert ended == 1
            free = reaper.execute("SELECT id FROM frozen_probe FOR UPDATE SKIP LOCKED").fetchall()
            assert free == [(1,)], "its row lock went with it"
    finally:
        frozen.close()

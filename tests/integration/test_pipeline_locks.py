"""A client frozen in the middle of a pipelined transaction (SIGSTOP, a long pause) must not hold its row
locks past the idle-in-transaction timeout: answers are fetched after a Sync, so the server waits "idle in
transaction", which the timeout ends, and never "active" mid-pipeline, which nothing ends."""

from __future__ import annotations

import psycopg

from eventstore import EventStore
from eventstore.spi import synced
from tests.waiting import wait_until
from workflows.pipelined_transactions import pipelined_transaction


def row_is_free(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as other:
        return bool(other.execute("SELECT 1 FROM lock_probe WHERE id = 1 FOR UPDATE SKIP LOCKED").fetchall())


def test_a_frozen_pipelined_transaction_releases_its_locks_at_the_idle_timeout(store: EventStore) -> None:
    with psycopg.connect(store.url, autocommit=True) as setup:
        setup.execute("CREATE TABLE lock_probe (id int PRIMARY KEY)")
        setup.execute("INSERT INTO lock_probe VALUES (1)")
    frozen = psycopg.connect(store.url, autocommit=True, options="-c idle_in_transaction_session_timeout=500")
    try:
        with pipelined_transaction(frozen):
            locked = synced(frozen.execute("SELECT id FROM lock_probe WHERE id = 1 FOR UPDATE")).fetchone()
            assert locked == (1,)
            # The client now "freezes" mid-transaction: it sends nothing more until the row is free.
            wait_until(lambda: row_is_free(store.url), timeout=15, what="the frozen session's lock to go")
        raise AssertionError("the frozen transaction must not commit")
    except psycopg.OperationalError:
        pass  # the server ended the session: nothing it held survives
    finally:
        frozen.close()


def test_without_the_sync_the_server_would_hold_the_lock(store: EventStore) -> None:
    """The hazard this guards against, shown on a plain pipeline: fetched with a flush, the server waits
    mid-pipeline as "active" and the idle timeout does not apply."""
    with psycopg.connect(store.url, autocommit=True) as setup:
        setup.execute("CREATE TABLE lock_probe (id int PRIMARY KEY)")
        setup.execute("INSERT INTO lock_probe VALUES (1)")
    with (
        psycopg.connect(
            store.url, autocommit=True, options="-c idle_in_transaction_session_timeout=200"
        ) as frozen,
        frozen.pipeline(),
    ):
        frozen.execute("BEGIN")
        frozen.execute("SELECT id FROM lock_probe WHERE id = 1 FOR UPDATE").fetchone()
        with psycopg.connect(store.url, autocommit=True) as other:
            state = other.execute(
                "SELECT pg_sleep(0.6), state FROM pg_stat_activity WHERE pid = %s",
                (frozen.info.backend_pid,),
            ).fetchone()
        assert state is not None
        assert state[1] == "active"
        assert not row_is_free(store.url), "still locked well past the idle timeout"
        frozen.execute("ROLLBACK")

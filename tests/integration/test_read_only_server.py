"""A server that turns read-only under a connection, as a primary does while a failover demotes it.

pg_auto_failover sets `default_transaction_read_only` on the old primary, then restarts it as a standby.
Here one session sets it for itself, which the server reports to the client in the same way
(ParameterStatus); the failover drill (tests/acceptance/test_failover.py) kills a real primary.
"""

from __future__ import annotations

import pytest

from eventstore import DatabaseUnavailableError, EventStore, NewEvent

READ_ONLY = "SET default_transaction_read_only = on"


def test_a_write_refused_as_read_only_is_an_outage_and_writes_nothing(store: EventStore) -> None:
    with store.pool.connection() as conn:
        conn.execute(READ_ONLY)
        with pytest.raises(DatabaseUnavailableError, match="read-only"):
            store.append("ro-1", [NewEvent("Tried", {})], conn=conn)
    assert store.read_stream("ro-1") == []


def test_the_pool_replaces_a_connection_whose_server_turned_read_only(store: EventStore) -> None:
    with store.pool.connection() as conn:
        conn.execute(READ_ONLY)
        demoted = conn.info.backend_pid
    seen = set()
    for _ in range(store.pool.max_size * 2):
        with store.pool.connection() as conn:
            seen.add(conn.info.backend_pid)
            row = conn.execute("SHOW default_transaction_read_only").fetchone()
            assert row == ("off",)
    assert demoted not in seen


def test_a_pinned_connection_whose_server_turned_read_only_is_replaced(store: EventStore) -> None:
    store.append("ro-2", [NewEvent("First", {})])
    pin = store._pins.acquire()
    assert pin is not None
    assert pin.conn is not None
    try:
        pin.conn.execute(READ_ONLY)
        demoted = pin.conn.info.backend_pid
    finally:
        store._pins.release()
    store.append("ro-2", [NewEvent("Second", {})])
    assert [e.type for e in store.read_stream("ro-2")] == ["First", "Second"]
    pin = store._pins.acquire()
    assert pin is not None
    assert pin.conn is not None
    try:
        assert pin.conn.info.backend_pid != demoted
    finally:
        store._pins.release()

"""One-event appends through libpq directly: the same rows, the same errors, the same exact values as
through psycopg, and they survive a session that lost its prepared statements."""

from __future__ import annotations

import uuid
from decimal import Decimal

import psycopg_pool
import pytest

from eventstore import NO_STREAM, EventStore, NewEvent, WrongExpectedVersionError
from eventstore.db import use_exact_json
from eventstore.errors import DuplicateEventIdError


def test_values_arrive_exactly(store: EventStore) -> None:
    correlation, causation = uuid.uuid4(), uuid.uuid4()
    data = {"amount": Decimal("1.00000000000000000001"), "name": "Zoë ✓ 🧾", "n": 2**70, "f": 0.1}
    event = NewEvent("Priced", data, {"by": "ünïcode"}, correlation_id=correlation, causation_id=causation)
    result = store.append("bücher-1", [event], expected_version=NO_STREAM, tenant="acme")
    assert result.versions == {"bücher-1": 1}
    # Looked at on the thread's pinned connection before anything else runs: a later checkout from the
    # pool takes the pin back (eventstore.pooling).
    with store._pins.connection() as conn:
        prepared = {row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements").fetchall()}
    assert "ledgerflow_append_one_event_no_stream" in prepared, "the append took the direct path"
    (read,) = store.read_stream("bücher-1", tenant="acme")
    assert (read.event_id, read.type, read.data, read.metadata) == (
        event.event_id,
        "Priced",
        data,
        {"by": "ünïcode"},
    )
    assert (read.correlation_id, read.causation_id) == (correlation, causation)
    assert (read.position, read.transaction_id) == (
        result.events[0].position,
        result.events[0].transaction_id,
    )


def test_refusals_are_the_same_typed_errors(store: EventStore) -> None:
    first = NewEvent("Happened", {})
    store.append("s", [first])
    with pytest.raises(WrongExpectedVersionError) as wrong:
        store.append("s", [NewEvent("Happened", {})], expected_version=5)
    assert wrong.value.actual == 1
    with pytest.raises(DuplicateEventIdError):
        store.append("t", [first])
    assert store.stream_version("s") == 1
    assert store.stream_version("t") is None


def test_a_session_that_lost_its_prepared_statements_prepares_them_again(store: EventStore) -> None:
    store.append("s", [NewEvent("Happened", {})])
    with store._pins.connection() as conn:
        conn.execute("DEALLOCATE ALL")
    assert store.append("s", [NewEvent("Happened", {})]).versions == {"s": 2}


def test_a_connection_in_another_encoding_appends_through_psycopg(database_url: str) -> None:
    pool = psycopg_pool.ConnectionPool(
        database_url,
        min_size=1,
        max_size=2,
        kwargs={"autocommit": True, "client_encoding": "LATIN1"},
        configure=use_exact_json,
        open=True,
    )
    with EventStore(pool, url=database_url, pinned_connections=1) as store:
        store.append("café", [NewEvent("Happened", {"é": "à"})])
        with store._pins.connection():
            owner = store._pins._local.owner
            assert not owner.pin.direct
        assert store.read_stream("café")[0].data == {"é": "à"}

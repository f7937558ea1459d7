"""Appending: optimistic concurrency per stream, atomic batches, idempotency keys, append-only log."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from pydantic import BaseModel

from eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    EventStore,
    EventTypes,
    IdempotencyConflictError,
    InvalidInputError,
    NewEvent,
    StreamAppend,
    WrongExpectedVersionError,
)
from eventstore.errors import DuplicateEventIdError


def ev(n: int = 0, kind: str = "Happened") -> NewEvent:
    return NewEvent(kind, {"n": n})


def count_events(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert row is not None
    return int(row[0])


def test_versions_start_at_one_and_continue(store: EventStore) -> None:
    first = store.append("order-1", [ev(1), ev(2)], expected_version=NO_STREAM)
    assert [e.stream_version for e in first.events] == [1, 2]
    second = store.append("order-1", [ev(3)], expected_version=2)
    assert second.versions == {"order-1": 3}
    assert first.events[0].position < first.events[1].position < second.events[0].position
    assert store.stream_version("order-1") == 3
    assert [e.data["n"] for e in store.read_stream("order-1")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("expected", "shown_actual"),
    [(NO_STREAM, 1), (5, 1), (STREAM_EXISTS, None)],
)
def test_wrong_expected_version_names_actual_and_writes_nothing(
    store: EventStore, expected: object, shown_actual: int | None
) -> None:
    stream = "existing" if shown_actual is not None else "missing"
    if shown_actual is not None:
        store.append(stream, [ev()])
    before = count_events(store)
    with pytest.raises(WrongExpectedVersionError) as caught:
        store.append(stream, [ev(), ev()], expected_version=expected)  # type: ignore[arg-type]
    assert caught.value.actual == shown_actual
    assert caught.value.stream_id == stream
    assert count_events(store) == before


def test_any_appends_to_new_and_existing_streams(store: EventStore) -> None:
    assert store.append("s", [ev()], expected_version=ANY).versions == {"s": 1}
    assert store.append("s", [ev()], expected_version=ANY).versions == {"s": 2}
    assert store.append("s", [ev()], expected_version=STREAM_EXISTS).versions == {"s": 3}


def test_multi_stream_append_is_atomic(store: EventStore) -> None:
    store.append("b", [ev()])
    with pytest.raises(WrongExpectedVersionError):
        store.append_many([StreamAppend("a", [ev()], NO_STREAM), StreamAppend("b", [ev()], NO_STREAM)])
    assert store.stream_version("a") is None
    assert count_events(store) == 1
    done = store.append_many([StreamAppend("a", [ev(), ev()], NO_STREAM), StreamAppend("b", [ev()], 1)])
    assert done.versions == {"a": 2, "b": 2}


def test_an_append_to_many_streams_puts_each_event_in_its_stream_in_order(store: EventStore) -> None:
    """Streams of one, two and three events, new and existing, in one append: each event lands in its own
    stream at the next versions, with positions in the streams' order (the order they are locked in) and
    each stream's events in their own order."""
    store.append("s-00", [ev(-1)])
    counts = {f"s-{i:02d}": 1 + i % 3 for i in range(30)}
    appends = [
        StreamAppend(s, [ev(i * 10 + n) for n in range(c)], ANY) for i, (s, c) in enumerate(counts.items())
    ]
    result = store.append_many(list(reversed(appends)))
    assert result.versions == {s: c + (s == "s-00") for s, c in counts.items()}
    positions = [e.position for e in result.events]
    assert positions == sorted(positions)
    assert [e.stream_id for e in result.events] == [s for s, c in sorted(counts.items()) for _ in range(c)]
    found = store.read_streams(list(counts))
    for i, (s, c) in enumerate(counts.items()):
        written = [e.data["n"] for e in found[s] if e.data["n"] >= 0]
        assert written == [i * 10 + n for n in range(c)]
        assert [e.stream_version for e in found[s]] == list(range(1, len(found[s]) + 1))
    with pytest.raises(WrongExpectedVersionError) as caught:
        store.append_many([StreamAppend("s-00", [ev()], 2), StreamAppend("s-29", [ev()], 99)])
    assert caught.value.stream_id == "s-29"
    assert count_events(store) == 1 + sum(counts.values())


def test_tenants_have_separate_streams(store: EventStore) -> None:
    store.append("s", [ev()], tenant="acme")
    store.append("s", [ev(), ev()], tenant="globex", expected_version=NO_STREAM)
    assert store.stream_version("s", tenant="acme") == 1
    assert store.stream_version("s", tenant="globex") == 2
    assert store.read_stream("s", tenant="default") == []


def test_idempotent_retry_returns_the_original_result(store: EventStore) -> None:
    first = store.append("pay-1", [ev(1)], idempotency_key="k-1")
    # A retry carries fresh event ids (a new NewEvent) but the same content.
    again = store.append("pay-1", [ev(1)], idempotency_key="k-1")
    assert not first.duplicate
    assert again.duplicate
    assert again.events == first.events
    assert count_events(store) == 1


def test_idempotency_key_with_other_content_conflicts(store: EventStore) -> None:
    store.append("pay-1", [ev(1)], idempotency_key="k-1")
    with pytest.raises(IdempotencyConflictError):
        store.append("pay-1", [ev(2)], idempotency_key="k-1")
    with pytest.raises(IdempotencyConflictError):
        store.append("pay-2", [ev(1)], idempotency_key="k-1")
    assert count_events(store) == 1


def test_idempotency_keys_are_scoped_per_tenant(store: EventStore) -> None:
    store.append("s", [ev(1)], idempotency_key="k", tenant="acme")
    other = store.append("s", [ev(2)], idempotency_key="k", tenant="globex")
    assert not other.duplicate
    assert count_events(store) == 2


def test_a_failed_append_does_not_consume_its_idempotency_key(store: EventStore) -> None:
    store.append("s", [ev()])
    with pytest.raises(WrongExpectedVersionError):
        store.append("s", [ev(1)], expected_version=NO_STREAM, idempotency_key="k")
    result = store.append("s", [ev(1)], expected_version=1, idempotency_key="k")
    assert not result.duplicate


def test_event_ids_are_unique_across_the_log(store: EventStore) -> None:
    event_id = uuid.uuid4()
    store.append("a", [NewEvent("T", {}, event_id=event_id)])
    with pytest.raises(DuplicateEventIdError):
        store.append("b", [NewEvent("T", {}, event_id=event_id)])
    assert count_events(store) == 1


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledgerflow.events SET data = '{}'",
        "DELETE FROM ledgerflow.events",
        "TRUNCATE ledgerflow.events",
    ],
)
def test_the_database_refuses_to_change_the_log(store: EventStore, statement: str) -> None:
    store.append("s", [ev()])
    with store.pool.connection() as conn:
        # Even with triggers of ordinary kind disabled for replication, the log stays append-only.
        conn.execute("SET session_replication_role = replica")
        with pytest.raises(psycopg.Error, match="append-only"):
            conn.execute(statement)
    assert count_events(store) == 1


def test_bulk_import_continues_stream_versions(store: EventStore) -> None:
    store.append("s-1", [ev(0)])
    imported = store.import_events([(f"s-{i % 3}", ev(i)) for i in range(30)])
    assert imported == 30
    assert store.stream_version("s-1") == 11
    assert [e.stream_version for e in store.read_stream("s-1")] == list(range(1, 12))
    assert store.append("s-0", [ev()], expected_version=10).versions == {"s-0": 11}


def test_declared_event_types_are_validated_on_append_and_decoded_on_read(store: EventStore) -> None:
    types = EventTypes()

    @types.event("OrderPlaced")
    class OrderPlaced(BaseModel):
        order_id: str
        amount: int

    typed = EventStore(store.pool, types=types)
    typed.append("order-9", [types.new(OrderPlaced(order_id="9", amount=5)), NewEvent("Untyped", {"x": 1})])
    with pytest.raises(InvalidInputError, match="declared model"):
        typed.append("order-9", [NewEvent("OrderPlaced", {"order_id": "9"})])
    placed, untyped = typed.read_stream("order-9")
    assert typed.types.decode(placed) == OrderPlaced(order_id="9", amount=5)
    assert typed.types.decode(untyped) is untyped


def test_read_streams_reads_several_whole_streams_at_once(store: EventStore) -> None:
    store.append("a", [ev(1), ev(2)])
    store.append("b", [ev(3)])
    store.append("a", [ev(4)], tenant="other")
    found = store.read_streams(["a", "b", "missing"])
    assert {s: [e.data["n"] for e in events] for s, events in found.items()} == {
        "a": [1, 2],
        "b": [3],
        "missing": [],
    }

"""Properties of appending, checked on random inputs against a real PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import EventStore, NewEvent, WrongExpectedVersionError
from tests.strategies import as_json_numbers, event_types, json_objects
from tests.waiting import joined


def fresh_stream() -> str:
    return f"p-{uuid.uuid4().hex}"


@given(data=json_objects, metadata=json_objects, event_type=event_types)
@settings(max_examples=60)
def test_round_trip_of_arbitrary_json(
    store: EventStore, data: dict[str, Any], metadata: dict[str, Any], event_type: str
) -> None:
    stream = fresh_stream()
    correlation, causation = uuid.uuid4(), uuid.uuid4()
    event = NewEvent(event_type, data, metadata, correlation_id=correlation, causation_id=causation)
    store.append(stream, [event])
    (read,) = store.read_stream(stream)
    assert read.type == event_type
    assert as_json_numbers(read.data) == as_json_numbers(data)
    assert as_json_numbers(read.metadata) == as_json_numbers(metadata)
    assert (read.event_id, read.correlation_id, read.causation_id) == (event.event_id, correlation, causation)


@given(
    batches=st.lists(st.lists(json_objects, min_size=1, max_size=3), min_size=1, max_size=5),
    retries=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=12),
)
@settings(max_examples=30)
def test_any_sequence_of_retries_writes_each_event_once(
    store: EventStore, batches: list[list[dict[str, Any]]], retries: list[int]
) -> None:
    """Appends are retried in any order and any number of times; each batch lands exactly once."""
    stream = fresh_stream()
    keys = [f"{stream}-{i}" for i in range(len(batches))]
    first_results: dict[int, Any] = {}
    for index in [i % len(batches) for i in retries] + list(range(len(batches))):
        result = store.append(
            stream, [NewEvent("Item", d) for d in batches[index]], idempotency_key=keys[index]
        )
        if index in first_results:
            assert result.duplicate
            assert result.events == first_results[index]
        else:
            assert not result.duplicate
            first_results[index] = result.events
    stored = store.read_stream(stream, limit=10_000)
    assert sorted(len(b) for b in batches) == sorted(
        len([e for e in stored if e.position in {a.position for a in first_results[i]}])
        for i in range(len(batches))
    )
    assert len(stored) == sum(len(b) for b in batches)


@given(writers=st.integers(min_value=2, max_value=6), rounds=st.integers(min_value=1, max_value=4))
@settings(max_examples=10)
def test_concurrent_appends_at_one_version_have_exactly_one_winner(
    store: EventStore, writers: int, rounds: int
) -> None:
    stream = fresh_stream()
    store.append(stream, [NewEvent("Start", {})])
    for version in range(1, rounds + 1):
        barrier = threading.Barrier(writers, timeout=60)
        outcomes: list[int | None] = []

        def attempt(
            worker: int, expected: int, barrier: threading.Barrier, outcomes: list[int | None]
        ) -> None:
            barrier.wait()
            try:
                store.append(stream, [NewEvent("Try", {"w": worker})], expected_version=expected)
                outcomes.append(None)
            except WrongExpectedVersionError as exc:
                outcomes.append(exc.actual)

        threads = [
            threading.Thread(target=attempt, args=(w, version, barrier, outcomes)) for w in range(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            joined(t)
        # One winner; every loser is told the version the winner reached.
        assert outcomes.count(None) == 1
        assert sorted(o for o in outcomes if o is not None) == [version + 1] * (writers - 1)
    assert [e.stream_version for e in store.read_stream(stream)] == list(range(1, rounds + 2))


@given(writers=st.integers(min_value=2, max_value=6))
@settings(max_examples=10)
def test_concurrent_retries_with_one_key_write_once(store: EventStore, writers: int) -> None:
    stream = fresh_stream()
    barrier = threading.Barrier(writers, timeout=60)
    results: list[Any] = []

    def attempt() -> None:
        barrier.wait()
        results.append(store.append(stream, [NewEvent("Pay", {"amount": 5})], idempotency_key=stream))

    threads = [threading.Thread(target=attempt) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    assert sum(not r.duplicate for r in results) == 1
    assert len({r.events for r in results}) == 1
    assert len(store.read_stream(stream)) == 1


exact_decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: abs(d.adjusted()) < 1000
)


@given(numbers=st.lists(exact_decimals, min_size=1, max_size=5))
@settings(max_examples=60)
def test_json_numbers_keep_their_exact_decimal_value(store: EventStore, numbers: list[Decimal]) -> None:
    stream = fresh_stream()
    store.append(stream, [NewEvent("Measured", {"values": numbers})])
    (read,) = store.read_stream(stream)
    assert [Decimal(repr(v)) if isinstance(v, float) else Decimal(v) for v in read.data["values"]] == numbers


@given(floats=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=5))
def test_floats_read_back_as_the_same_floats(store: EventStore, floats: list[float]) -> None:
    stream = fresh_stream()
    store.append(stream, [NewEvent("Measured", {"values": floats})])
    (read,) = store.read_stream(stream)
    # PostgreSQL writes 1e16 as 10000000000000000, which reads back as an int of the same value.
    assert all(isinstance(v, float | int) for v in read.data["values"])
    assert [float(v) for v in read.data["values"]] == floats


def test_the_numbers_doubles_lose_are_kept(store: EventStore) -> None:
    data = {"tiny": Decimal("1e-400"), "long": Decimal("1.00000000000000000001"), "half": 0.5}
    store.append("n-1", [NewEvent("Measured", data)])
    (read,) = store.read_stream("n-1")
    assert read.data == {"tiny": Decimal("1e-400"), "long": Decimal("1.00000000000000000001"), "half": 0.5}
    assert isinstance(read.data["half"], float)

"""Versioned event types against the real log: appends record the version, every read returns the latest
shape, the stored events never change, and a projection rebuilt over mixed versions equals its
incremental state."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from eventstore import (
    START,
    UPCAST_FROM_KEY,
    VERSION_KEY,
    EventStore,
    EventTypes,
    InvalidInputError,
    NewEvent,
    UpcastError,
)
from projector import (
    ProjectorWorker,
    RetrySettings,
    WorkerSettings,
    event_type_catalogue,
    failure_rows,
    rebuild,
    type_counts,
)
from projector.digest import projection_digest
from tests.projections import expire_leases, make_counter


class PaidV1(BaseModel):
    euros: int


class PaidV2(BaseModel):
    cents: int


class PaidV3(BaseModel):
    amount: int
    currency: str


class Undeclared(BaseModel):
    pass


MODELS: dict[int, type[BaseModel]] = {1: PaidV1, 2: PaidV2, 3: PaidV3}


def paid_types() -> EventTypes:
    types = EventTypes()
    for version, model in MODELS.items():
        types.register("Paid", model, version)
    types.add_upcaster("Paid", 1, 2, lambda d: {"cents": d["euros"] * 100})

    @types.upcaster("Paid", 2, 3)
    def _(old: PaidV2) -> PaidV3:
        return PaidV3(amount=old.cents, currency="EUR")

    return types


def paid(version: int, cents: int) -> BaseModel:
    """A Paid event of `cents` in the given version's shape (version 1 counts whole euros)."""
    if version == 1:
        return PaidV1(euros=cents)
    if version == 2:
        return PaidV2(cents=cents)
    return PaidV3(amount=cents, currency="EUR")


def latest_amount(version: int, n: int) -> int:
    return n * 100 if version == 1 else n


@pytest.fixture
def typed(store: EventStore) -> EventStore:
    return EventStore(store.pool, types=paid_types())


def stored_rows(store: EventStore) -> list[tuple[Any, ...]]:
    with store.pool.connection() as conn:
        return conn.execute(
            "SELECT position, event_type, data, metadata FROM ledgerflow.events ORDER BY position"
        ).fetchall()


def read_everything(store: EventStore, **options: Any) -> list[Any]:
    """Every event of the log, paging until caught up (a page may stop short while a writer ends)."""
    events: list[Any] = []
    cursor, caught_up = START, False
    while not caught_up:
        page = (store.read_all_encoded if options else store.read_all)(cursor, **options)
        events.extend(page.events)
        cursor, caught_up = page.cursor, page.caught_up
    return events


def test_reads_return_the_latest_shape_and_the_log_keeps_the_stored_one(typed: EventStore) -> None:
    typed.append("order-1", [paid(1, 3), paid(2, 250)])
    typed.append("order-1", [NewEvent("Paid", {"amount": 7, "currency": "USD"}), NewEvent("Other", {"x": 1})])
    before = stored_rows(typed)
    assert [r[3].get(VERSION_KEY) for r in before] == [1, 2, 3, None]
    expected = [{"amount": 300, "currency": "EUR"}, {"amount": 250, "currency": "EUR"}]
    expected += [{"amount": 7, "currency": "USD"}, {"x": 1}]
    assert [e.data for e in typed.read_stream("order-1")] == expected
    assert [e.data for e in read_everything(typed)] == expected
    assert [e.data for e in typed.read_streams(["order-1"])["order-1"]] == expected
    first = typed.read_stream("order-1")[0]
    assert first.metadata == {VERSION_KEY: 3, UPCAST_FROM_KEY: 1}
    # On request only, for readers of JSON text (the HTTP API).
    page = typed.read_stream_page("order-1", upcast=True)
    assert [e.decode().data for e in page.events] == expected
    assert typed.read_stream_page("order-1").events[0].decode().data == {"euros": 3}
    assert [e.decode().data for e in read_everything(typed, upcast=True)] == expected
    assert [e.data for e in typed.read_stream("order-1", upcast=False)][:2] == [{"euros": 3}, {"cents": 250}]
    assert stored_rows(typed) == before


def test_subscriptions_deliver_the_latest_shape(typed: EventStore) -> None:
    typed.append("order-2", [paid(1, 1), paid(3, 5)])
    subscription = typed.subscribe(START, poll_interval=0.05)
    seen = []
    for event in subscription:
        seen.append(event.data)
        if len(seen) == 2:
            subscription.stop()
    assert seen == [{"amount": 100, "currency": "EUR"}, {"amount": 5, "currency": "EUR"}]


def test_events_stored_before_their_type_was_declared_count_as_version_one(store: EventStore) -> None:
    store.append("order-3", [NewEvent("Paid", {"euros": 4})])  # no model declared for this store
    assert stored_rows(store)[0][3] == {}
    assert paid_types().upcast(store.read_stream("order-3")[0]).data == {"amount": 400, "currency": "EUR"}
    typed = EventStore(store.pool, types=paid_types())
    assert typed.read_stream("order-3")[0].data == {"amount": 400, "currency": "EUR"}


def test_bad_appends_are_refused_and_write_nothing(typed: EventStore) -> None:
    with pytest.raises(InvalidInputError, match="version 3"):
        typed.append("order-4", [NewEvent("Paid", {"euros": 1})])  # a raw event is the latest version
    with pytest.raises(InvalidInputError, match="latest declared is 3"):
        typed.append("order-4", [NewEvent("Paid", {"euros": 1}, metadata={VERSION_KEY: 4})])
    with pytest.raises(InvalidInputError, match="not a declared event type"):
        typed.append("order-4", [PaidV1(euros=1), Undeclared()])
    assert stored_rows(typed) == []


def test_a_failing_upcaster_names_the_event_and_leaves_it_stored(
    typed: EventStore, store: EventStore
) -> None:
    store.append("order-5", [NewEvent("Paid", {"price": 1}, metadata={VERSION_KEY: 1})])
    with pytest.raises(UpcastError) as raised:
        typed.read_stream("order-5")
    (row,) = stored_rows(store)
    assert raised.value.details()["position"] == row[0]
    assert raised.value.details()["event_type"] == "Paid"
    assert raised.value.details()["step"] == [1, 2]
    assert typed.read_stream("order-5", upcast=False)[0].data == {"price": 1}


def test_concurrent_appends_of_mixed_versions_all_land_once(typed: EventStore) -> None:
    def append_many(version: int) -> None:
        for i in range(20):
            typed.append(f"order-c{i % 3}", [paid(version, i)])

    threads = [threading.Thread(target=append_many, args=(v,)) for v in (1, 2, 3, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = read_everything(typed)
    assert len(events) == 80
    assert sorted(e.data["amount"] for e in events) == sorted(
        latest_amount(v, i) for v in (1, 2, 3, 1) for i in range(20)
    )
    assert {e.metadata[VERSION_KEY] for e in events} == {3}


# An action: append Paid events of mixed versions to a stream, take worker steps, or "crash" the worker.
appends = st.tuples(
    st.just("append"),
    st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.integers(0, 50)), min_size=1, max_size=5),
)
steps = st.tuples(st.just("step"), st.integers(1, 3), st.just([]))
crashes = st.tuples(st.just("crash"), st.just(0), st.just([]))
actions = st.lists(st.one_of(appends, steps, crashes), min_size=1, max_size=20)


#: One counter for every example of the property (one schema, its tables created once): each example
#: writes streams of its own and checks those, and the counter, incremental then rebuilt, carries over.
#: A counter per example cost a schema and its tables each time, and a catch-up from the start over the
#: log of the examples before it, about a third of the example's server round trips, for nothing the
#: property checks (the rebuilds still read the whole log from the start, in its mixed versions).
UPCAST_COUNTER = make_counter(name="upcast_counter", schema="p_upcast")  # sums data["amount"] per stream


@given(actions=actions, batch_size=st.integers(1, 8))
@settings(max_examples=20)
def test_rebuild_over_mixed_versions_equals_incremental_state(
    store: EventStore, actions: list[tuple[str, int, list[tuple[int, int]]]], batch_size: int
) -> None:
    typed = EventStore(store.pool, types=paid_types())
    counter, schema = UPCAST_COUNTER, UPCAST_COUNTER.schema
    prefix = f"s{uuid.uuid4().hex[:10]}"  # this example's streams
    config = WorkerSettings(lease_ttl=30, heartbeat_interval=10, batch_size=batch_size)
    worker = ProjectorWorker(typed, [counter, event_type_catalogue], config)
    expected: dict[str, int] = {}
    try:
        for kind, n, events in actions:
            if kind == "append":
                stream = f"{prefix}-{n}"
                typed.append(stream, [paid(v, c) for v, c in events])
                expected[stream] = expected.get(stream, 0) + sum(latest_amount(v, c) for v, c in events)
            elif kind == "step":
                worker.acquire_free_leases()
                for _ in range(n):
                    worker.work_once()
            else:
                expire_leases(store, counter.name, event_type_catalogue.name)
                worker = ProjectorWorker(typed, [counter, event_type_catalogue], config)
        worker.run_until_caught_up()
        with store.pool.connection() as conn:
            live = projection_digest(conn, counter, schema)
            totals = dict(conn.execute(f'SELECT stream_id, total FROM "{schema}".counts').fetchall())
            catalogue = projection_digest(conn, event_type_catalogue, "ledgerflow")
            counts = type_counts(conn, None)
            versions = conn.execute(
                "SELECT coalesce((metadata->>'$schema_version')::int, 0), count(*) FROM ledgerflow.events"
                " GROUP BY 1 ORDER BY 1"
            ).fetchall()
        # Every event was applied in its latest shape, whatever version it was stored at.
        assert {s: t for s, t in totals.items() if s.startswith(prefix)} == expected
        assert rebuild(typed, counter, batch_size=batch_size).digest == live
        # The catalogue counts every event by the version it was stored at, as a count of the log does.
        assert counts is not None
        assert [(c.schema_version, c.events) for c in counts] == [tuple(r) for r in versions]
        assert rebuild(typed, event_type_catalogue, batch_size=batch_size).digest == catalogue
    finally:
        # The next example's worker takes the leases at once (a failing example must not hold them).
        worker.release_all()


def test_an_event_no_upcaster_can_read_is_a_projection_failure_to_skip(store: EventStore) -> None:
    typed = EventStore(store.pool, types=paid_types())
    typed.append("order-6", [paid(1, 1)])
    store.append("order-6", [NewEvent("Paid", {"price": 1}, metadata={VERSION_KEY: 1})])  # 1->2 fails
    typed.append("order-6", [paid(2, 5)])
    counter = make_counter()
    retry = RetrySettings(attempts=2, initial_backoff=0.001, max_backoff=0.01)
    worker = ProjectorWorker(typed, [counter], WorkerSettings(lease_ttl=5, heartbeat_interval=1, retry=retry))
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        (failure,) = failure_rows.list_failures(conn, counter.name, include_closed=True)
        assert failure.stream_version == 2
        assert failure.error_class == "eventstore.errors.UpcastError"
        assert failure_rows.request_failure_skip(conn, failure.id, "tester")
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        totals = conn.execute("SELECT stream_id, n, total FROM ledgerflow.counts").fetchall()
    assert totals == [("order-6", 2, 105)]
    worker.release_all()

"""Bad input gets a clear, typed error and leaves the log untouched."""

from __future__ import annotations

import math
import uuid
from typing import Any

import psycopg.errors
import pytest

from eventstore import EventStore, EventTooLargeError, InvalidInputError, NewEvent, StreamAppend
from eventstore.db import wrap_exceptions
from eventstore.errors import DuplicateEventIdError
from eventstore.store import DEFAULT_TENANT


def log_size(store: EventStore) -> tuple[int, int, int]:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM ledgerflow.events), (SELECT count(*) FROM ledgerflow.streams),"
            " (SELECT count(*) FROM ledgerflow.idempotency_keys)"
        ).fetchone()
    assert row is not None
    return (int(row[0]), int(row[1]), int(row[2]))


class NotJson:
    pass


BAD_APPENDS: list[tuple[str, dict[str, Any]]] = [
    ("non-JSON data", {"events": [NewEvent("T", {"x": NotJson()})]}),
    ("data not an object", {"events": [NewEvent("T", [1, 2])]}),  # type: ignore[arg-type]
    ("NaN", {"events": [NewEvent("T", {"x": math.nan})]}),
    ("NUL character", {"events": [NewEvent("T", {"x": "a\x00b"})]}),
    ("lone surrogate", {"events": [NewEvent("T", {"x": "\ud800"})]}),
    ("non-JSON metadata", {"events": [NewEvent("T", {}, {"m": {1, 2}})]}),
    ("oversized event", {"events": [NewEvent("T", {"x": "y" * (1024 * 1024 + 1)})]}),
    ("empty stream id", {"stream_id": ""}),
    ("blank stream id", {"stream_id": "   "}),
    ("control characters in stream id", {"stream_id": "a\nb"}),
    ("overlong stream id", {"stream_id": "s" * 401}),
    ("invalid tenant", {"tenant": "Bad Tenant!"}),
    ("empty tenant", {"tenant": ""}),
    ("invalid idempotency key", {"idempotency_key": "has space"}),
    ("empty idempotency key", {"idempotency_key": ""}),
    ("overlong idempotency key", {"idempotency_key": "k" * 201}),
    ("invalid event type", {"events": [NewEvent("1starts-with-digit", {})]}),
    ("empty event type", {"events": [NewEvent("", {})]}),
    ("no events", {"events": []}),
    ("version zero", {"expected_version": 0}),
    ("negative version", {"expected_version": -5}),
    ("boolean version", {"expected_version": True}),
    ("not an event", {"events": [{"type": "T", "data": {}}]}),
]


@pytest.mark.parametrize(("case", "overrides"), BAD_APPENDS, ids=[c for c, _ in BAD_APPENDS])
def test_bad_append_is_refused_with_a_typed_error(
    store: EventStore, case: str, overrides: dict[str, Any]
) -> None:
    store.append("existing", [NewEvent("T", {})], idempotency_key="seed")
    before = log_size(store)
    call: dict[str, Any] = {
        "stream_id": "target",
        "events": [NewEvent("T", {"ok": True})],
        "tenant": DEFAULT_TENANT,
        "idempotency_key": f"k-{uuid.uuid4().hex}",
    } | overrides
    with pytest.raises(InvalidInputError) as caught:
        store.append(call.pop("stream_id"), call.pop("events"), **call)
    assert str(caught.value), "the error must say what is wrong"
    assert log_size(store) == before


def test_oversized_event_error_names_the_limit(store: EventStore) -> None:
    with pytest.raises(EventTooLargeError, match="limit is 1048576"):
        store.append("s", [NewEvent("Big", {"x": "y" * (1024 * 1024)})])


def test_one_bad_event_refuses_the_whole_multi_stream_append(store: EventStore) -> None:
    before = log_size(store)
    with pytest.raises(InvalidInputError):
        store.append_many(
            [StreamAppend("a", [NewEvent("T", {})]), StreamAppend("b", [NewEvent("T", {"x": math.inf})])]
        )
    with pytest.raises(InvalidInputError, match="appears twice"):
        store.append_many([StreamAppend("a", [NewEvent("T", {})]), StreamAppend("a", [NewEvent("T", {})])])
    assert log_size(store) == before


def test_bad_bulk_import_writes_nothing(store: EventStore) -> None:
    before = log_size(store)
    rows = [("s", NewEvent("T", {"i": i})) for i in range(10)] + [("s", NewEvent("T", {"bad": math.nan}))]
    with pytest.raises(InvalidInputError):
        store.import_events(rows)
    assert log_size(store) == before


@pytest.mark.parametrize("limit", [0, -1, 100_001])
def test_bad_read_limits(store: EventStore, limit: int) -> None:
    with pytest.raises(InvalidInputError):
        store.read_all(limit=limit)
    with pytest.raises(InvalidInputError):
        store.read_stream("s", limit=limit)


def test_reads_check_tenant_and_stream(store: EventStore) -> None:
    with pytest.raises(InvalidInputError):
        store.read_stream("", tenant="default")
    with pytest.raises(InvalidInputError):
        store.read_all(tenant="NOT VALID")


def test_a_nul_in_a_parameter_says_so(store: EventStore) -> None:
    with pytest.raises(InvalidInputError, match="NUL character"):
        store.read_all(types=["a\x00b"])


def test_event_ids_are_unique_per_tenant_and_tell_nothing_of_other_tenants(store: EventStore) -> None:
    event_id = uuid.uuid4()
    store.append("order-1", [NewEvent("Placed", {}, event_id=event_id)], tenant="tenant-b")
    # Another tenant may use the same id: the answer does not reveal that tenant-b holds it.
    store.append("order-1", [NewEvent("Placed", {}, event_id=event_id)], tenant="tenant-a")
    with pytest.raises(DuplicateEventIdError) as raised:
        store.append("order-2", [NewEvent("Placed", {}, event_id=event_id)], tenant="tenant-a")
    assert "tenant-b" not in str(raised.value)
    assert isinstance(raised.value.__cause__, psycopg.errors.UniqueViolation)


def test_driver_errors_keep_their_cause(store: EventStore) -> None:
    with pytest.raises(InvalidInputError) as raised, store.pool.connection() as conn, wrap_exceptions():
        conn.execute("SELECT 'x'::int")
    assert isinstance(raised.value.__cause__, psycopg.errors.InvalidTextRepresentation)
    assert "invalid input syntax for type integer" in str(raised.value)


def test_a_package_maps_its_own_sqlstates_and_constraints(store: EventStore) -> None:
    class Fenced(BaseException):
        pass

    class Taken(LookupError):
        pass

    fence = {"LF099": lambda exc: Fenced(exc.diag.message_primary)}
    with store.pool.connection() as conn:
        with pytest.raises(Fenced) as fenced, wrap_exceptions(fence):
            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'fenced' USING ERRCODE = 'LF099'; END $$")
        assert isinstance(fenced.value.__cause__, psycopg.Error)
        conn.execute("CREATE TEMP TABLE t (k int CONSTRAINT t_k_unique UNIQUE)")
        taken = {"t_k_unique": lambda exc: Taken("k taken")}
        with pytest.raises(Taken), wrap_exceptions(constraints=taken):
            conn.execute("INSERT INTO t VALUES (1), (1)")

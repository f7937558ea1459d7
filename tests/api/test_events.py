"""Appending and reading events over HTTP: idempotency, If-Match, validation, size limits."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from eventstore import Cursor
from ops.api import create_app
from ops.api.settings import ApiSettings
from ops.services import Services
from tests.api.helpers import Headers, MakeToken, event_count, events_body, read_log_to_end
from tests.waiting import wait_until

STREAM = "/api/v1/streams/order-42"
APPEND = f"{STREAM}/events"


def test_append_then_read_the_stream(client: TestClient, admin: Headers) -> None:
    response = client.post(APPEND, json=events_body("OrderPlaced", "OrderPaid"), headers=admin)
    assert response.status_code == 201
    body = response.json()
    assert body["duplicate"] is False
    assert [(e["stream_id"], e["stream_version"]) for e in body["events"]] == [
        ("order-42", 1),
        ("order-42", 2),
    ]
    assert response.headers["ETag"] == '"2"'
    Cursor.parse(body["events"][0]["cursor"])

    events = client.get(STREAM, headers=admin).json()["events"]
    assert [(e["type"], e["stream_version"], e["data"]) for e in events] == [
        ("OrderPlaced", 1, {"n": 0}),
        ("OrderPaid", 2, {"n": 1}),
    ]
    backward = client.get(STREAM, params={"backward": "true", "limit": 1}, headers=admin).json()["events"]
    assert [e["stream_version"] for e in backward] == [2]
    later = client.get(STREAM, params={"from_version": 2}, headers=admin).json()["events"]
    assert [e["type"] for e in later] == ["OrderPaid"]
    assert client.get(STREAM, params={"from_version": 9}, headers=admin).json() == {
        "events": [],
        "next_version": None,
    }


def test_event_fields_are_kept(client: TestClient, admin: Headers) -> None:
    event_id, correlation = uuid.uuid4(), uuid.uuid4()
    event = {
        "type": "OrderPlaced",
        "data": {"total": 30, "items": ["a", "b"]},
        "metadata": {"source": "test"},
        "event_id": str(event_id),
        "correlation_id": str(correlation),
    }
    assert client.post(APPEND, json={"events": [event]}, headers=admin).status_code == 201
    [read] = client.get(STREAM, headers=admin).json()["events"]
    assert read["event_id"] == str(event_id)
    assert read["correlation_id"] == str(correlation)
    assert read["causation_id"] is None
    assert read["metadata"] == {"source": "test"}
    assert read["data"] == {"total": 30, "items": ["a", "b"]}


def test_a_repeat_with_the_same_idempotency_key_writes_nothing(
    client: TestClient, admin: Headers, database_url: str
) -> None:
    headers = {**admin, "Idempotency-Key": "pay-42"}
    first = client.post(APPEND, json=events_body("OrderPaid"), headers=headers)
    again = client.post(APPEND, json=events_body("OrderPaid"), headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["duplicate"] is True
    assert again.json()["events"] == first.json()["events"]
    assert event_count(database_url) == 1

    other = client.post(APPEND, json=events_body("OrderRefunded"), headers=headers)
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert other.json()["error"]["details"] == {"idempotency_key": "pay-42"}
    assert event_count(database_url) == 1


@pytest.mark.parametrize("if_match", ["no-stream", '"no-stream"', "*"])
def test_if_match_on_a_new_stream(client: TestClient, admin: Headers, if_match: str) -> None:
    response = client.post(APPEND, json=events_body(), headers={**admin, "If-Match": if_match})
    assert response.status_code == 201


def test_if_match_guards_the_stream_version(client: TestClient, admin: Headers, database_url: str) -> None:
    def append(if_match: str) -> int:
        return client.post(APPEND, json=events_body(), headers={**admin, "If-Match": if_match}).status_code

    assert append("exists") == 409  # no stream yet
    assert append("1") == 409
    assert append("no-stream") == 201
    assert append("no-stream") == 409
    assert append("1") == 201
    assert append('"2"') == 201  # the ETag form
    assert append("2") == 409
    assert append("exists") == 201
    assert append("*") == 201
    assert event_count(database_url) == 5

    conflict = client.post(APPEND, json=events_body(), headers={**admin, "If-Match": "3"}).json()["error"]
    assert conflict["code"] == "wrong_expected_version"
    assert conflict["details"] == {"stream_id": "order-42", "expected": "version 3", "actual": 5}
    assert conflict["next"]


@pytest.mark.parametrize("if_match", ["0", "-1", "abc", "1.5", 'W/"1"', "99999999999999999999", ""])
def test_an_invalid_if_match_is_422(
    client: TestClient, admin: Headers, database_url: str, if_match: str
) -> None:
    response = client.post(APPEND, json=events_body(), headers={**admin, "If-Match": if_match})
    assert response.status_code == 422, response.text
    assert event_count(database_url) == 0


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({}, {}),
        ({"events": []}, {}),
        ({"events": "x"}, {}),
        ({"events": [{"type": "A"}]}, {}),  # no data
        ({"events": [{"type": "A", "data": [1]}]}, {}),
        ({"events": [{"type": "A", "data": {}, "metadata": "m"}]}, {}),
        ({"events": [{"type": "1bad", "data": {}}]}, {}),
        ({"events": [{"type": "", "data": {}}]}, {}),
        ({"events": [{"type": "A", "data": {}, "event_id": "not-a-uuid"}]}, {}),
        ({"events": [{"type": "A", "data": {}, "surprise": 1}]}, {}),
        ({"events": [{"type": "A", "data": {"s": "nul \u0000 here"}}]}, {}),
        (
            {"events": [{"type": "A", "data": {}, "event_id": str(uuid.UUID(int=7))}] * 2},
            {},
        ),
        (events_body(), {"Idempotency-Key": "has space"}),
    ],
)
def test_invalid_appends_are_422_and_write_nothing(
    client: TestClient, admin: Headers, database_url: str, body: object, headers: dict[str, str]
) -> None:
    response = client.post(APPEND, json=body, headers={**admin, **headers})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] in ("invalid_request", "invalid_input")
    assert error["message"]
    assert error["next"]
    assert event_count(database_url) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"events": [{"type": "A", "data": {"x": NaN}}]}',
        b'{"events": [{"type": "A", "data": {"x": Infinity}}]}',
        b'{"events": [{"type": "A", "data": {"x": "\\ud800"}}]}',
        b'{"events": [{"type": "A", "data": {"x": ' + b"1" * 5000 + b"}}]}",
        b"[" * 100_000,
        b"{not json",
    ],
)
def test_bodies_json_cannot_carry_are_422(
    client: TestClient, admin: Headers, database_url: str, raw: bytes
) -> None:
    response = client.post(APPEND, content=raw, headers={**admin, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert event_count(database_url) == 0


def test_an_event_over_the_store_limit_is_422(client: TestClient, admin: Headers, database_url: str) -> None:
    big = {"events": [{"type": "A", "data": {"blob": "x" * (1024 * 1024 + 1)}}]}
    response = client.post(APPEND, json=big, headers=admin)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "event_too_large"
    assert event_count(database_url) == 0


@pytest.fixture
def small_client(services: Services) -> Iterator[TestClient]:
    with TestClient(create_app(services, settings=ApiSettings(max_request_bytes=4096))) as c:
        yield c


def test_a_body_over_the_request_limit_is_413(
    small_client: TestClient, admin: Headers, database_url: str
) -> None:
    big = {"events": [{"type": "A", "data": {"blob": "x" * 5000}}]}
    response = small_client.post(APPEND, json=big, headers=admin)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large"
    assert error["details"] == {"limit": 4096}
    assert event_count(database_url) == 0
    assert small_client.post(APPEND, json=events_body(), headers=admin).status_code == 201


def test_a_streamed_body_is_counted_as_it_arrives(
    small_client: TestClient, admin: Headers, database_url: str
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"events": [{"type": "A", "data": {"blob": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}}]}'

    # A generator body goes out chunked, without Content-Length: only counting can catch it.
    response = small_client.post(
        APPEND, content=chunks(), headers={**admin, "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert event_count(database_url) == 0


def test_a_body_is_refused_by_its_content_length_before_it_is_read(
    small_client: TestClient, admin: Headers
) -> None:
    response = small_client.post(
        APPEND,
        content=b"{}",
        headers={**admin, "Content-Type": "application/json", "Content-Length": "999999"},
    )
    assert response.status_code == 413


@pytest.mark.parametrize("stream", ["wf-00000000-0000-0000-0000-000000000001", "wfkey-linear:k"])
def test_workflow_streams_are_written_by_the_engine_alone(
    client: TestClient, admin: Headers, database_url: str, stream: str
) -> None:
    response = client.post(f"/api/v1/streams/{stream}/events", json=events_body(), headers=admin)
    assert response.status_code == 422
    response = client.post(APPEND, json=events_body("wf.RunStarted"), headers=admin)
    assert response.status_code == 422
    assert event_count(database_url) == 0


def test_an_unknown_stream_is_404(client: TestClient, admin: Headers) -> None:
    response = client.get("/api/v1/streams/nothing-here", headers=admin)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_stream_ids_may_contain_slashes(client: TestClient, admin: Headers) -> None:
    assert (
        client.post("/api/v1/streams/files/a/b.txt/events", json=events_body(), headers=admin).status_code
        == 201
    )
    [event] = client.get("/api/v1/streams/files/a/b.txt", headers=admin).json()["events"]
    assert event["stream_id"] == "files/a/b.txt"


def test_reading_the_log_resumes_from_the_cursor(client: TestClient, admin: Headers) -> None:
    for stream, kind in [
        ("order-1", "OrderPlaced"),
        ("invoice-1", "InvoiceSent"),
        ("order-2", "OrderPlaced"),
    ]:
        client.post(f"/api/v1/streams/{stream}/events", json=events_body(kind), headers=admin)

    def everything() -> list[dict[str, object]] | None:
        page = client.get("/api/v1/events", headers=admin).json()
        return page["events"] if len(page["events"]) == 3 else None

    # Readers of the global log wait for older transactions (of any database on the server) to end.
    events = wait_until(everything, what="all three events to be readable")
    assert events is not None
    assert [e["stream_id"] for e in events] == ["order-1", "invoice-1", "order-2"]

    first = client.get("/api/v1/events", params={"limit": 1}, headers=admin).json()
    assert first["caught_up"] is False
    rest = read_log_to_end(client, admin, {"after": first["cursor"]})
    assert [e["stream_id"] for e in rest] == ["invoice-1", "order-2"]
    orders = read_log_to_end(client, admin, {"category": "order"})
    assert [e["stream_id"] for e in orders] == ["order-1", "order-2"]
    invoices = read_log_to_end(client, admin, {"type": ["InvoiceSent"]})
    assert [e["stream_id"] for e in invoices] == ["invoice-1"]


@pytest.mark.parametrize(
    "params",
    [
        {"after": "nonsense"},
        {"after": "1"},
        {"after": "99999999999999999999:1"},
        {"limit": 0},
        {"limit": 5000},
        {"type": "1bad"},
    ],
)
def test_bad_log_queries_are_422(client: TestClient, admin: Headers, params: dict[str, str | int]) -> None:
    response = client.get("/api/v1/events", params=params, headers=admin)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/streams/order-%FF",
        "/api/v1/streams/order-%C3%28",
        "/api/v1/streams/order-%ED%A0%80",  # an encoded surrogate
    ],
)
def test_a_path_that_is_not_utf8_is_refused_not_folded(client: TestClient, admin: Headers, path: str) -> None:
    for response in (
        client.post(f"{path}/events", json=events_body(), headers=admin),
        client.get(path, headers=admin),
    ):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_utf8"
        assert "not valid UTF-8" in error["message"]


def test_a_query_that_is_not_utf8_is_refused(client: TestClient, admin: Headers) -> None:
    response = client.get("/api/v1/events?category=order%FF", headers=admin)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_utf8"


def test_a_nul_in_a_query_is_refused_with_a_message_that_says_so(client: TestClient, admin: Headers) -> None:
    response = client.get("/api/v1/runs?status=a%00b", headers=admin)
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]["message"]


def test_a_body_that_is_not_utf8_is_refused(client: TestClient, admin: Headers, database_url: str) -> None:
    body = b'{"events": [{"type": "T", "data": {"name": "caf\xe9"}}]}'
    response = client.post(APPEND, content=body, headers={**admin, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert "request body is not valid UTF-8" in response.json()["error"]["message"]
    assert event_count(database_url) == 0


def test_json_numbers_keep_their_exact_value_end_to_end(client: TestClient, admin: Headers) -> None:
    body = b'{"events": [{"type": "Measured", "data": {"a": 1.00000000000000000001, "b": 1e-400, "c": 0.5}}]}'
    response = client.post(APPEND, content=body, headers={**admin, "Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    [event] = json.loads(client.get(STREAM, headers=admin).content, parse_float=Decimal)["events"]
    assert event["data"] == {
        "a": Decimal("1.00000000000000000001"),
        "b": Decimal("1e-400"),
        "c": Decimal("0.5"),
    }

    def logged() -> list[dict[str, object]]:
        page = json.loads(client.get("/api/v1/events", headers=admin).content, parse_float=Decimal)
        return list(page["events"])

    [from_log] = wait_until(logged, what="the event to be readable")
    assert from_log["data"] == event["data"]


def test_an_event_id_of_another_tenant_is_not_revealed(client: TestClient, make_token: MakeToken) -> None:
    tenant_a, tenant_b = make_token("admin", tenant="acme"), make_token("admin", tenant="globex")
    event_id = str(uuid.uuid4())
    body = {"events": [{"type": "T", "data": {}, "event_id": event_id}]}
    assert client.post(APPEND, json=body, headers=tenant_b).status_code == 201
    assert client.post(APPEND, json=body, headers=tenant_a).status_code == 201
    again = client.post("/api/v1/streams/order-43/events", json=body, headers=tenant_a)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "duplicate_event_id"


def test_pages_stop_at_the_byte_budget_and_resume(
    client: TestClient, admin: Headers, services: Services
) -> None:
    services.store.max_page_bytes = 250_000
    for i in range(6):
        body = {"events": [{"type": "Big", "data": {"i": i, "pad": "x" * 100_000}}]}
        assert client.post(APPEND, json=body, headers=admin).status_code == 201

    page = client.get(STREAM, params={"limit": 1000}, headers=admin).json()
    assert [e["stream_version"] for e in page["events"]] == [1, 2, 3]
    assert page["next_version"] == 4
    rest = client.get(STREAM, params={"from_version": 4}, headers=admin).json()
    assert [e["stream_version"] for e in rest["events"]] == [4, 5, 6]

    def page_of_three(params: dict[str, str]) -> dict[str, Any]:
        """A page of the log that holds three events. A read's horizon is held back, for that read only, by a
        transaction of the server (another test's, another database's) that ends while the read looks at it
        (see ledgerflow.log_holders): such a read is read again, as a reader is told to."""
        got: dict[str, Any] = {}

        def three() -> bool:
            got.update(client.get("/api/v1/events", params=params, headers=admin).json())
            return len(got["events"]) >= 3

        wait_until(three, what="a page of three events")
        return got

    log_page = page_of_three({})
    assert [e["data"]["i"] for e in log_page["events"]] == [0, 1, 2]
    assert log_page["caught_up"] is False
    more = page_of_three({"after": log_page["cursor"]})
    assert [e["data"]["i"] for e in more["events"]] == [3, 4, 5]

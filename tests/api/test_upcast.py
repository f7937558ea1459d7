"""Reading over HTTP in the latest shape, on request (`?upcast=true`); by default as stored."""

from __future__ import annotations

from fastapi.testclient import TestClient

import tests.event_types  # noqa: F401  (declares TestLineAdded in the default registry)
from eventstore import UPCAST_FROM_KEY, VERSION_KEY
from tests.api.helpers import Headers
from tests.waiting import wait_until

STREAM = "/api/v1/streams/cart-1"


def test_reads_upcast_on_request(client: TestClient, admin: Headers) -> None:
    old = {"type": "TestLineAdded", "data": {"total": 2}, "metadata": {VERSION_KEY: 1}}
    new = {"type": "TestLineAdded", "data": {"amount_cents": 5, "currency": "USD"}}
    assert client.post(f"{STREAM}/events", json={"events": [old, new]}, headers=admin).status_code == 201
    stored = client.get(STREAM, headers=admin).json()["events"]
    assert [e["data"] for e in stored] == [{"total": 2}, {"amount_cents": 5, "currency": "USD"}]
    assert [e["metadata"] for e in stored] == [{VERSION_KEY: 1}, {VERSION_KEY: 2}]
    latest = [{"amount_cents": 200, "currency": "EUR"}, {"amount_cents": 5, "currency": "USD"}]
    upcast = client.get(STREAM, params={"upcast": "true"}, headers=admin).json()["events"]
    assert [e["data"] for e in upcast] == latest
    assert upcast[0]["metadata"] == {VERSION_KEY: 2, UPCAST_FROM_KEY: 1}

    def log_page() -> list[dict[str, object]] | None:
        page = client.get("/api/v1/events", params={"upcast": "true"}, headers=admin).json()
        return page["events"] if len(page["events"]) == 2 else None

    assert [e["data"] for e in wait_until(log_page, what="both events readable") or []] == latest
    assert client.get(STREAM, headers=admin).json()["events"] == stored  # the log is unchanged


def test_an_old_shape_without_its_version_is_422(client: TestClient, admin: Headers) -> None:
    body = {"events": [{"type": "TestLineAdded", "data": {"total": 2}}]}
    response = client.post(f"{STREAM}/events", json=body, headers=admin)
    assert response.status_code == 422
    assert "version 2" in response.json()["error"]["message"]
    assert client.get(STREAM, headers=admin).status_code == 404

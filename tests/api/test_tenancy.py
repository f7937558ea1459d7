"""Tenant isolation: a token sees and changes only its own tenant's streams and runs.

Another tenant's stream or run is indistinguishable from one that does not exist (404), and actions
on it change nothing; operator actions that span tenants need `admin` (403 otherwise).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers, MakeToken, event_count, events_body
from tests.waiting import wait_until


@pytest.fixture
def tenant_a(make_token: MakeToken) -> Headers:
    return make_token("append", "read", "operate", tenant="tenant-a")


@pytest.fixture
def tenant_b(make_token: MakeToken) -> Headers:
    return make_token("append", "read", "operate", tenant="tenant-b")


def test_streams_of_another_tenant_are_invisible(
    client: TestClient, tenant_a: Headers, tenant_b: Headers, services: Services
) -> None:
    assert (
        client.post("/api/v1/streams/order-1/events", json=events_body("B1"), headers=tenant_b).status_code
        == 201
    )

    assert client.get("/api/v1/streams/order-1", headers=tenant_a).status_code == 404
    # The version B's stream has means nothing to A: A has no such stream.
    guarded = client.post(
        "/api/v1/streams/order-1/events", json=events_body("A1"), headers={**tenant_a, "If-Match": "1"}
    )
    assert guarded.status_code == 409
    assert guarded.json()["error"]["details"]["actual"] is None
    # A writes its own stream of the same name; B's is untouched.
    created = client.post(
        "/api/v1/streams/order-1/events",
        json=events_body("A1"),
        headers={**tenant_a, "If-Match": "no-stream"},
    )
    assert created.status_code == 201
    assert [e["type"] for e in client.get("/api/v1/streams/order-1", headers=tenant_b).json()["events"]] == [
        "B1"
    ]
    assert [e["type"] for e in client.get("/api/v1/streams/order-1", headers=tenant_a).json()["events"]] == [
        "A1"
    ]

    def log_of(headers: Headers) -> list[str] | None:
        events = client.get("/api/v1/events", headers=headers).json()["events"]
        return [e["type"] for e in events] or None

    assert wait_until(lambda: log_of(tenant_a), what="A's event in the log") == ["A1"]
    assert wait_until(lambda: log_of(tenant_b), what="B's event in the log") == ["B1"]


def test_idempotency_keys_are_per_tenant(client: TestClient, tenant_a: Headers, tenant_b: Headers) -> None:
    url = "/api/v1/streams/order-1/events"
    assert (
        client.post(url, json=events_body("B"), headers={**tenant_b, "Idempotency-Key": "k"}).status_code
        == 201
    )
    # The same key with other content is no conflict in another tenant, and no duplicate either.
    again = client.post(url, json=events_body("A"), headers={**tenant_a, "Idempotency-Key": "k"})
    assert again.status_code == 201
    assert again.json()["duplicate"] is False


def test_runs_of_another_tenant_are_not_found_and_not_changed(
    client: TestClient, tenant_a: Headers, tenant_b: Headers, database_url: str, services: Services
) -> None:
    run_id = client.post("/api/v1/workflows/linear/runs", json={"key": "k"}, headers=tenant_b).json()[
        "run_id"
    ]
    before = event_count(database_url)

    assert client.get(f"/api/v1/runs/{run_id}", headers=tenant_a).status_code == 404
    for action, body in [("cancel", None), ("retry", None), ("refresh", {"input": 1})]:
        response = client.post(f"/api/v1/runs/{run_id}/{action}", json=body, headers=tenant_a)
        assert response.status_code == 404, (action, response.text)
    assert client.get(f"/api/v1/streams/wf-{run_id}", headers=tenant_a).status_code == 404
    assert event_count(database_url) == before
    assert client.get(f"/api/v1/runs/{run_id}", headers=tenant_b).json()["status"] == "running"

    # The same key is free in another tenant.
    other = client.post("/api/v1/workflows/linear/runs", json={"key": "k"}, headers=tenant_a)
    assert other.status_code == 201
    assert other.json()["run_id"] != run_id

    projector = ProjectorWorker(services.store, services.projections)

    def runs_of(headers: Headers) -> list[Any]:
        projector.run_until_caught_up()
        runs: list[Any] = client.get("/api/v1/runs", headers=headers).json()["runs"]
        return runs

    assert [r["run_id"] for r in wait_until(lambda: runs_of(tenant_b), what="B's run")] == [run_id]
    assert [r["run_id"] for r in runs_of(tenant_a)] == [other.json()["run_id"]]
    projector.release_all()


def test_idempotent_starts_are_per_tenant(client: TestClient, tenant_a: Headers, tenant_b: Headers) -> None:
    url = "/api/v1/workflows/linear/runs"
    b = client.post(url, json={"input": 1}, headers={**tenant_b, "Idempotency-Key": "start"})
    a = client.post(url, json={"input": 2}, headers={**tenant_a, "Idempotency-Key": "start"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["run_id"] != b.json()["run_id"]


def test_cross_tenant_operator_actions_need_admin(client: TestClient, tenant_a: Headers) -> None:
    # Projection health is global and readable; acting on projections and failures is not.
    assert client.get("/api/v1/projections", headers=tenant_a).status_code == 200
    for method, path, body in [
        ("GET", "/api/v1/failures", None),
        ("POST", "/api/v1/projections/stream_catalogue/rebuild", None),
        ("POST", "/api/v1/projections/stream_catalogue/verify", None),
        ("POST", "/api/v1/projections/stream_catalogue/replay", {"after": "0:0"}),
        ("POST", "/api/v1/failures/1/retry", None),
        ("POST", "/api/v1/failures/1/skip", None),
    ]:
        assert client.request(method, path, json=body, headers=tenant_a).status_code == 403, path

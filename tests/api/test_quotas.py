"""Per-tenant quotas over HTTP: 429 with `Retry-After` and the API's error shape, nothing written, and
another tenant unaffected; debounced starts over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.api import create_app
from ops.auth import create_token
from ops.services import Services, open_services
from ops.settings import Settings
from tests.api.helpers import Headers, MakeToken, event_count, events_body
from workflows import pending_debounces


def quota_client(database_url: str, **quotas: float) -> Iterator[tuple[TestClient, Services]]:
    services = open_services(Settings(database_url=database_url, workflows="tests.flows:registry", **quotas))
    try:
        with TestClient(create_app(services)) as client:
            yield client, services
    finally:
        services.close()


def token(services: Services, tenant: str) -> Headers:
    _, secret = create_token(services.store, tenant=tenant, scopes=("append",), name="test")
    return {"Authorization": f"Bearer {secret}"}


def assert_refused(answer: Any, quota: str, at_least: int) -> None:
    assert answer.status_code == 429, answer.text
    assert int(answer.headers["Retry-After"]) >= at_least
    error = answer.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert error["details"]["quota"] == quota
    assert error["details"]["retry_after"] > 0
    assert error["next"]


@pytest.fixture
def slow_rates(database_url: str) -> Iterator[tuple[TestClient, Services]]:
    # One request per 100 s: the second is refused however slowly the test runs.
    yield from quota_client(database_url, tenant_appends_per_second=0.01, tenant_starts_per_second=0.01)


def test_appends_per_second(slow_rates: tuple[TestClient, Services], database_url: str) -> None:
    client, services = slow_rates
    acme, globex = token(services, "acme"), token(services, "globex")
    assert client.post("/api/v1/streams/s-1/events", json=events_body(), headers=acme).status_code == 201
    before = event_count(database_url)
    answer = client.post("/api/v1/streams/s-1/events", json=events_body(), headers=acme)
    assert_refused(answer, "appends_per_second", 90)
    assert "LEDGERFLOW_TENANT_APPENDS_PER_SECOND" in answer.json()["error"]["message"]
    assert event_count(database_url) == before
    assert client.post("/api/v1/streams/s-1/events", json=events_body(), headers=globex).status_code == 201


def test_starts_per_second(slow_rates: tuple[TestClient, Services], database_url: str) -> None:
    client, services = slow_rates
    acme, globex = token(services, "acme"), token(services, "globex")
    assert client.post("/api/v1/workflows/linear/runs", json={}, headers=acme).status_code == 201
    before = event_count(database_url)
    assert_refused(
        client.post("/api/v1/workflows/linear/runs", json={}, headers=acme), "starts_per_second", 90
    )
    assert event_count(database_url) == before
    assert client.post("/api/v1/workflows/linear/runs", json={}, headers=globex).status_code == 201


def test_runs_in_flight(database_url: str) -> None:
    for client, services in quota_client(database_url, tenant_max_runs_in_flight=1):
        acme, globex = token(services, "acme"), token(services, "globex")
        assert client.post("/api/v1/workflows/linear/runs", json={}, headers=acme).status_code == 201
        before = event_count(database_url)
        answer = client.post("/api/v1/workflows/linear/runs", json={"key": "k"}, headers=acme)
        assert_refused(answer, "max_runs_in_flight", 1)
        assert event_count(database_url) == before
        assert client.post("/api/v1/workflows/linear/runs", json={}, headers=globex).status_code == 201


def test_debounced_starts(client: TestClient, make_token: MakeToken, services: Services) -> None:
    acme = make_token("append")
    body = {"input": {"n": 1}, "debounce": {"key": "doc-7", "window": 60}}
    first = client.post("/api/v1/workflows/linear/runs", json=body, headers=acme)
    assert first.status_code == 201, first.text
    again = client.post("/api/v1/workflows/linear/runs", json={**body, "input": {"n": 2}}, headers=acme)
    assert again.status_code == 200
    assert again.json()["run_id"] == first.json()["run_id"]
    assert again.json()["debounced_until"] >= first.json()["debounced_until"]
    [burst] = pending_debounces(services.store)
    assert (burst.tenant, burst.workflow, burst.key, burst.starts) == ("acme", "linear", "doc-7", 2)


@pytest.mark.parametrize(
    "debounce",
    [{"key": "", "window": 1}, {"key": "k", "window": 0}, {"key": "k", "window": 1e9}, {"key": "k"}],
)
def test_bad_debounce_is_refused(
    client: TestClient, make_token: MakeToken, services: Services, database_url: str, debounce: object
) -> None:
    before = event_count(database_url)
    answer = client.post("/api/v1/workflows/linear/runs", json={"debounce": debounce}, headers=make_token())
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "invalid_request"
    assert event_count(database_url) == before
    assert pending_debounces(services.store) == []


def test_debounce_with_a_run_key_is_refused(
    client: TestClient, make_token: MakeToken, services: Services
) -> None:
    body = {"key": "k", "debounce": {"key": "d", "window": 1}}
    answer = client.post("/api/v1/workflows/linear/runs", json=body, headers=make_token())
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "invalid_input"
    assert pending_debounces(services.store) == []

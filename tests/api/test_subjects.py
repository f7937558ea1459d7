"""`POST /api/v1/subjects/{subject}/forget`: a tenant's administrator forgets its own tenant's subjects, a
server administrator any tenant's; the API's reads then answer the personal fields as `[forgotten]`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from eventstore import REDACTED, generate_master_key, personal_fields
from ops.services import Services, open_services
from ops.settings import Settings
from tests.api.helpers import Headers, MakeToken, read_log_to_end
from tests.api.roles import server_admin, tenant_admin

personal_fields("ApiCustomerSeen", subject="customer_id", fields=["email"])


@pytest.fixture
def services(database_url: str) -> Iterator[Services]:
    settings = Settings(
        database_url=database_url,
        workflows="tests.flows:registry",
        master_key=generate_master_key(),  # type: ignore[arg-type]
    )
    opened = open_services(settings)
    try:
        yield opened
    finally:
        opened.close()


def _seen(client: TestClient, headers: Headers, customer: str, email: str) -> None:
    body = {"events": [{"type": "ApiCustomerSeen", "data": {"customer_id": customer, "email": email}}]}
    response = client.post(f"/api/v1/streams/customer-{customer}/events", json=body, headers=headers)
    assert response.status_code == 201, response.text


def _emails(client: TestClient, headers: Headers, customer: str) -> list[str]:
    events = client.get(f"/api/v1/streams/customer-{customer}", headers=headers).json()["events"]
    log = read_log_to_end(client, headers, {"type": "ApiCustomerSeen"})
    from_log = [e["data"]["email"] for e in log if e["stream_id"] == f"customer-{customer}"]
    from_stream = [e["data"]["email"] for e in events]
    assert from_log == from_stream
    return from_stream


def test_a_tenant_admin_forgets_its_own_subject(client: TestClient, services: Services) -> None:
    acme = tenant_admin(services, "acme")
    _seen(client, acme, "c1", "ann@example.com")
    _seen(client, acme, "c2", "bob@example.com")
    assert _emails(client, acme, "c1") == ["ann@example.com"]
    response = client.post("/api/v1/subjects/c1/forget", json={"reason": "erasure request"}, headers=acme)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["tenant"], body["subject"], body["already"]) == ("acme", "c1", False)
    assert _emails(client, acme, "c1") == [REDACTED]
    assert _emails(client, acme, "c2") == ["bob@example.com"]
    again = client.post("/api/v1/subjects/c1/forget", headers=acme).json()
    assert again["already"] is True
    assert again["key_id"] == body["key_id"]


def test_a_tenant_admin_cannot_forget_another_tenants_subject(
    client: TestClient, services: Services, make_token: MakeToken
) -> None:
    globex = tenant_admin(services, "globex")
    _seen(client, globex, "c1", "ann@globex.example")
    acme = tenant_admin(services, "acme")
    response = client.post("/api/v1/subjects/c1/forget", params={"tenant": "globex"}, headers=acme)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    # Its own tenant's c1 is another subject: forgetting it leaves globex's c1 readable.
    assert client.post("/api/v1/subjects/c1/forget", headers=acme).status_code == 200
    assert _emails(client, globex, "c1") == ["ann@globex.example"]
    reader = make_token("read", "append", tenant="globex")
    assert client.post("/api/v1/subjects/c1/forget", headers=reader).status_code == 403
    # A server administrator may forget any tenant's subject.
    ops = server_admin(services)
    response = client.post("/api/v1/subjects/c1/forget", params={"tenant": "globex"}, headers=ops)
    assert response.status_code == 200, response.text
    assert _emails(client, globex, "c1") == [REDACTED]
    bad = client.post("/api/v1/subjects/c1/forget", params={"tenant": "Not A Tenant"}, headers=ops)
    assert bad.status_code == 422


def test_appending_personal_fields_without_a_master_key_says_what_to_set(
    database_url: str, services: Services
) -> None:
    from ops.api import create_app

    bare = open_services(Settings(database_url=database_url, workflows="tests.flows:registry"))
    try:
        with TestClient(create_app(bare)) as client:
            headers = tenant_admin(bare, "acme")
            body = {"events": [{"type": "ApiCustomerSeen", "data": {"customer_id": "c", "email": "e@x"}}]}
            response = client.post("/api/v1/streams/customer-c/events", json=body, headers=headers)
            # The server's configuration is at fault, not the request: a 500 that names the setting.
            assert response.status_code == 500
            error = response.json()["error"]
            assert error["code"] == "master_key_missing"
            assert "LEDGERFLOW_MASTER_KEY" in error["next"]
            assert client.get("/api/v1/streams/customer-c", headers=headers).status_code == 404
    finally:
        bare.close()

"""What keeps one tenant's requests from stalling another's: token lookups kept for a few seconds (a
revoked token stops working within LEDGERFLOW_TOKEN_CACHE_SECONDS), a cap on each tenant's requests in
flight (429 with Retry-After, nothing written), and a waiting read whose client went away giving its
place back at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.api import create_app
from ops.api.settings import ApiSettings
from ops.auth import create_token, revoke_token
from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import MakeToken, event_count, events_body
from tests.waiting import wait_until
from workflows import workflow_tables


def _client(services: Services, **settings: Any) -> TestClient:
    return TestClient(create_app(services, settings=ApiSettings(**settings)))


@pytest.mark.parametrize("ttl", [0.0, 1.0, 300.0])
def test_a_revoked_token_stops_working_within_the_cache_time(services: Services, ttl: float) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["read"], name="t")
    headers = {"Authorization": f"Bearer {secret}"}
    with _client(services, token_cache_seconds=ttl) as client:
        assert client.get("/api/v1/runs", headers=headers).status_code == 200
        revoke_token(services.store, token_id)
        revoked_at = time.monotonic()
        if ttl == 0:  # nothing kept: the very next request is refused
            assert client.get("/api/v1/runs", headers=headers).status_code == 401
        elif ttl == 300:  # kept: still served until the cache time is over
            assert client.get("/api/v1/runs", headers=headers).status_code == 200
        else:
            wait_until(
                lambda: client.get("/api/v1/runs", headers=headers).status_code == 401,
                timeout=ttl + 15,
                what="the revoked token to be refused",
            )
            assert time.monotonic() - revoked_at >= 0  # refused, and not before it was revoked


def test_a_bogus_token_is_refused_from_what_was_kept(services: Services, database_url: str) -> None:
    headers = {"Authorization": "Bearer lf_0123456789abcdef_" + "x" * 43}
    with _client(services, token_cache_seconds=300) as client:
        first = client.post("/api/v1/streams/s/events", json=events_body(), headers=headers)
        # The lookups' database went away: a refusal kept answers without it, as the first did.
        services.store.pool.close()
        again = client.post("/api/v1/streams/s/events", json=events_body(), headers=headers)
    assert (first.status_code, again.status_code) == (401, 401)
    assert again.json()["error"]["code"] == "unauthenticated"
    assert event_count(database_url) == 0


def _hold(client: TestClient, tenant: str, n: int) -> None:
    """`n` of `tenant`'s requests in flight, as `n` slow requests would be."""
    in_flight = client.app.state.in_flight  # type: ignore[attr-defined]

    async def enter() -> None:
        for _ in range(n):
            assert await in_flight.enter(tenant)

    client.portal.call(enter)  # type: ignore[union-attr]


def _release(client: TestClient, tenant: str, n: int) -> None:
    in_flight = client.app.state.in_flight  # type: ignore[attr-defined]
    client.portal.call(lambda: [in_flight.leave(tenant) for _ in range(n)])  # type: ignore[union-attr]


def test_a_tenant_past_its_requests_in_flight_and_its_line_gets_429_and_others_are_served(
    services: Services, make_token: MakeToken, database_url: str
) -> None:
    acme, other = make_token("admin", tenant="acme"), make_token("admin", tenant="other")
    with _client(services, max_requests_per_tenant=2, max_queued_requests_per_tenant=0) as client:
        assert client.get("/api/v1/runs", headers=acme).status_code == 200  # warms the token lookup
        _hold(client, "acme", 2)
        refused = client.post("/api/v1/streams/s/events", json=events_body(), headers=acme)
        served = client.post("/api/v1/streams/s/events", json=events_body(), headers=other)
        _release(client, "acme", 2)
        again = client.post("/api/v1/streams/s/events", json=events_body(), headers=acme)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "too_many_requests"
    assert error["details"] == {"limit": 2, "setting": "LEDGERFLOW_MAX_REQUESTS_PER_TENANT"}
    assert "LEDGERFLOW_MAX_REQUESTS_PER_TENANT" in error["message"]
    assert (served.status_code, again.status_code) == (201, 201)
    assert event_count(database_url) == 2  # other's and acme's second: nothing of the refused one


def test_a_request_past_the_cap_waits_in_its_tenants_line_and_goes_on_when_a_slot_frees(
    services: Services, make_token: MakeToken, database_url: str
) -> None:
    acme = make_token("admin", tenant="acme")
    with _client(services, max_requests_per_tenant=2, request_queue_seconds=1.0) as client:
        in_flight = client.app.state.in_flight  # type: ignore[attr-defined]
        assert client.get("/api/v1/runs", headers=acme).status_code == 200
        _hold(client, "acme", 2)
        # Nobody leaves: the wait runs out, and the request is refused having done nothing.
        timed_out = client.post("/api/v1/streams/s/events", json=events_body(), headers=acme)
        assert timed_out.status_code == 429, timed_out.text
        assert event_count(database_url) == 0
        # A slot frees while one waits: it goes on, and is the only one counted.
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.post, "/api/v1/streams/s/events", json=events_body(), headers=acme)
            wait_until(lambda: in_flight.queued("acme") == 1, timeout=30, what="a request in the line")
            _release(client, "acme", 1)
            assert waiting.result(timeout=30).status_code == 201
        assert (in_flight.of("acme"), in_flight.queued("acme")) == (1, 0)
        _release(client, "acme", 1)
    assert event_count(database_url) == 1


@pytest.fixture
def one_waiter(services: Services) -> Iterator[TestClient]:
    with _client(services, max_projection_waiters_per_tenant=1) as c:
        yield c


def test_a_waiting_read_whose_client_goes_away_frees_its_place(
    one_waiter: TestClient, services: Services, make_token: MakeToken
) -> None:
    acme = make_token("admin", tenant="acme")
    ProjectorWorker(services.store, [workflow_tables]).run_until_caught_up()
    cursor = one_waiter.post("/api/v1/workflows/linear/runs", json={}, headers=acme).json()["cursor"]
    app, portal = one_waiter.app, one_waiter.portal
    assert portal is not None
    waiters = app.state.waiters  # type: ignore[attr-defined]
    in_flight = app.state.in_flight  # type: ignore[attr-defined]
    gone = portal.call(asyncio.Event)
    sent: list[dict[str, Any]] = []
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    query = f"min_cursor={cursor}&wait=30".encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/v1/runs",
        "raw_path": b"/api/v1/runs",
        "query_string": query,
        "headers": [(b"authorization", acme["Authorization"].encode()), (b"host", b"x")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    request = portal.start_task_soon(app, scope, receive, send)
    wait_until(lambda: waiters.waiting == 1, timeout=30, what="the read to wait")
    assert in_flight.of("acme") == 0  # a waiting read holds no thread: it is not counted in flight
    # The tenant's one place is taken: another waiting read is refused.
    params = {"min_cursor": cursor, "wait": 1}
    assert one_waiter.get("/api/v1/runs", params=params, headers=acme).status_code == 429
    began = time.monotonic()
    portal.call(gone.set)
    request.result(timeout=30)
    assert time.monotonic() - began < 20  # long before its 30 s wait would have ended
    assert waiters.waiting == 0
    assert in_flight.of("acme") == 0
    # The place is free again: the next waiting read waits (and times out: no projector runs).
    assert one_waiter.get("/api/v1/runs", params=params, headers=acme).status_code == 504

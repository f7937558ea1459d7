"""Bounded requests: the token is checked before any byte of a body is read, and read-your-writes waits
are capped in total and per tenant (429 with Retry-After, nothing written)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.api import create_app
from ops.api.settings import ApiSettings
from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers, MakeToken, event_count
from tests.waiting import wait_until
from workflows import workflow_tables

BOGUS = {"Authorization": "Bearer lf_0123456789abcdef_" + "x" * 43}


def _call(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[int, bool]:
    """One POST with a 2 MiB body straight into the ASGI app: its status, and whether any body was read."""
    read = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read = True
        return {"type": "http.request", "body": b"x" * (2 * 1024 * 1024), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/streams/order-1/events",
        "raw_path": b"/api/v1/streams/order-1/events",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"2097152"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    # On a thread of its own: the browser tests' Playwright, open for the whole session, keeps an event
    # loop running on the main thread of the test process that ran them, and asyncio.run refuses to start
    # beside it (which tests share a process depends on how the run is spread).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, app(scope, receive, send)).result(timeout=60)
    return sent[0]["status"], read


@pytest.mark.parametrize(
    "authorization",
    [None, b"Bearer nonsense", b"Bearer lf_0123456789abcdef_" + b"x" * 43, b"Basic dXNlcjpwdw=="],
)
def test_a_request_without_a_live_token_is_refused_before_its_body_is_read(
    services: Services, authorization: bytes | None
) -> None:
    app = create_app(services)
    status, read = _call(app, [] if authorization is None else [(b"authorization", authorization)])
    assert (status, read) == (401, False)


def test_a_live_token_gets_its_body_read(services: Services, make_token: MakeToken) -> None:
    app = create_app(services)
    secret = make_token("append")["Authorization"].encode()
    status, read = _call(app, [(b"authorization", secret)])
    assert read
    assert status == 422  # the body is read and parsed: not JSON


def test_a_refused_body_closes_the_connection_and_keeps_the_error_shape(
    client: TestClient, database_url: str
) -> None:
    response = client.post("/api/v1/streams/order-1/events", content=b"{}" * 1000, headers=BOGUS)
    assert response.status_code == 401
    assert response.headers["connection"] == "close"
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "unauthenticated"
    assert event_count(database_url) == 0


@pytest.fixture
def capped(services: Services) -> Iterator[TestClient]:
    settings = ApiSettings(max_projection_waiters=3, max_projection_waiters_per_tenant=2)
    with TestClient(create_app(services, settings=settings)) as c:
        yield c


def test_waiters_past_the_caps_are_refused_with_429_and_nothing_written(
    capped: TestClient, services: Services, make_token: MakeToken, database_url: str
) -> None:
    acme, other = make_token("admin", tenant="acme"), make_token("admin", tenant="other")
    # The run tables were projected once; no projector runs now, so they stay behind the new runs.
    # One projector for the test: a second would wait for the first one's lease to run out (10 s).
    projector = ProjectorWorker(services.store, [workflow_tables])
    projector.run_until_caught_up()
    cursors = {
        name: capped.post("/api/v1/workflows/linear/runs", json={}, headers=h).json()["cursor"]
        for name, h in (("acme", acme), ("other", other))
    }
    written = event_count(database_url)
    waiters = capped.app.state.waiters  # type: ignore[attr-defined]
    answers: list[int] = []

    def wait(headers: Headers, cursor: str) -> None:
        params = {"min_cursor": cursor, "wait": 30}
        answers.append(capped.get("/api/v1/runs", params=params, headers=headers).status_code)

    threads = [threading.Thread(target=wait, args=(acme, cursors["acme"])) for _ in range(2)]
    threads.append(threading.Thread(target=wait, args=(other, cursors["other"])))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: waiters.waiting == 3, timeout=30, what="three reads to wait")
        for headers, cursor, scope, setting in (
            (acme, cursors["acme"], "tenant", "LEDGERFLOW_MAX_PROJECTION_WAITERS_PER_TENANT"),
            (other, cursors["other"], "total", "LEDGERFLOW_MAX_PROJECTION_WAITERS"),
        ):
            refused = capped.get("/api/v1/runs", params={"min_cursor": cursor, "wait": 8}, headers=headers)
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "too_many_waiters"
            assert error["details"]["scope"] == scope
            assert error["details"]["setting"] == setting
            assert setting in error["message"]
        # A read without min_cursor is never refused for it.
        assert capped.get("/api/v1/runs", headers=acme).status_code == 200
        assert event_count(database_url) == written
        # The waiters are answered once the projection passes their writes, and their slots come back.
        projector.run_until_caught_up()
    finally:
        for t in threads:
            t.join(30)
    assert answers == [200, 200, 200]
    assert waiters.waiting == 0

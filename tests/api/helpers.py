"""Helpers shared by the API tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from fastapi.testclient import TestClient

Headers = dict[str, str]
#: `make_token("read", tenant="acme")` -> headers carrying a fresh token with those scopes.
MakeToken = Callable[..., Headers]


def event_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert row is not None
    return int(row[0])


def events_body(*types: str, data: dict[str, object] | None = None) -> dict[str, object]:
    return {"events": [{"type": t, "data": data or {"n": i}} for i, t in enumerate(types or ("Happened",))]}


def read_log_to_end(
    client: TestClient, headers: Headers, params: dict[str, Any] | None = None, *, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """`GET /api/v1/events` page after page until a page is caught up, as a reader is told to: a page may
    stop short at the log's horizon, which any transaction on the server holds back while it ends (another
    test's database under xdist included)."""
    events: list[dict[str, Any]] = []
    query = dict(params or {})
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/api/v1/events", params=query, headers=headers)
        assert response.status_code == 200, response.text
        page = response.json()
        events += page["events"]
        if page["caught_up"]:
            return events
        assert time.monotonic() < deadline, f"the log's horizon stayed behind for {timeout:g} s"
        query["after"] = page["cursor"]
        if not page["events"]:
            time.sleep(0.05)  # the horizon moves when another session's transaction ends: nothing to await

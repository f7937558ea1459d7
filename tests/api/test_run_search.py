"""Searching runs and reading a run's history over HTTP: tags at the start, every filter, keyset pages
with an opaque cursor, 422 for bad tags and bad cursors (nothing written), and other tenants' runs not
found."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers, event_count
from tests.waiting import wait_until
from workflows import WorkerSettings, WorkflowWorker
from workflows.testing import running_worker


@pytest.fixture
def worker(services: Services) -> Iterator[WorkflowWorker]:
    with running_worker(
        services.engine,
        services.registry,
        WorkerSettings(concurrency=4, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2),
        name="api-search-worker",
    ) as w:
        yield w


def start(client: TestClient, headers: Headers, workflow: str, **body: Any) -> str:
    response = client.post(f"/api/v1/workflows/{workflow}/runs", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["run_id"])


def listed(client: TestClient, headers: Headers, **params: Any) -> dict[str, Any]:
    response = client.get("/api/v1/runs", params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_runs_are_found_by_tags_and_filters_a_page_at_a_time(
    client: TestClient, admin: Headers, make_token: Any, services: Services
) -> None:
    red = [
        start(client, admin, "linear", input={"n": i}, tags={"team": "red", "n": str(i)}) for i in range(5)
    ]
    blue = start(client, admin, "diamond", tags={"team": "blue"})
    ProjectorWorker(services.store, services.projections).run_until_caught_up()

    found = listed(client, admin, tag="team=red")
    assert {r["run_id"] for r in found["runs"]} == set(red)
    assert found["next"] is None
    assert found["runs"][0]["tags"]["team"] == "red"
    assert [r["run_id"] for r in listed(client, admin, tag=["team=red", "n=3"])["runs"]] == [red[3]]
    assert [r["run_id"] for r in listed(client, admin, workflow="diamond")["runs"]] == [blue]
    assert len(listed(client, admin, status=["running", "succeeded"])["runs"]) == 6
    assert len(listed(client, admin, version="1")["runs"]) == 6
    assert listed(client, admin, started_after="2999-01-01T00:00:00Z")["runs"] == []
    assert listed(client, admin, ended_before="2000-01-01T00:00:00Z")["runs"] == []

    pages: list[str] = []
    params: dict[str, Any] = {"tag": "team=red", "limit": 2}
    while True:
        page = listed(client, admin, **params)
        pages += [r["run_id"] for r in page["runs"]]
        if page["next"] is None:
            break
        params["after"] = page["next"]
    assert sorted(pages) == sorted(red)
    assert len(pages) == 5

    first = listed(client, admin, limit=2)
    other = client.get("/api/v1/runs", params={"after": first["next"], "workflow": "linear"}, headers=admin)
    assert other.status_code == 422
    assert "another search" in other.json()["error"]["message"]
    bogus = client.get("/api/v1/runs", params={"after": "!!!"}, headers=admin)
    assert bogus.status_code == 422
    assert client.get("/api/v1/runs", params={"tag": "no-equals"}, headers=admin).status_code == 422
    assert client.get("/api/v1/runs", params={"status": "paused?"}, headers=admin).status_code == 422

    # Another tenant sees none of them, whatever it asks, and cannot continue this tenant's pages.
    globex = make_token("read", tenant="globex")
    assert listed(client, globex, tag="team=red")["runs"] == []
    assert listed(client, globex)["runs"] == []
    assert client.get("/api/v1/runs", params={"after": first["next"]}, headers=globex).status_code == 422
    assert client.get(f"/api/v1/runs/{red[0]}/history", headers=globex).status_code == 404


@pytest.mark.parametrize(
    ("tags", "setting"),
    [
        ({f"k{i}": "v" for i in range(33)}, "LEDGERFLOW_MAX_TAGS_PER_RUN"),
        ({"k" * 65: "v"}, "LEDGERFLOW_MAX_TAG_KEY_CHARS"),
        ({"k": "v" * 257}, "LEDGERFLOW_MAX_TAG_VALUE_CHARS"),
        ({"no spaces": "v"}, None),
    ],
)
def test_bad_tags_are_a_422_and_write_nothing(
    client: TestClient, admin: Headers, database_url: str, tags: dict[str, str], setting: str | None
) -> None:
    before = event_count(database_url)
    response = client.post("/api/v1/workflows/linear/runs", json={"tags": tags}, headers=admin)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "run_tag_invalid"
    assert error["details"].get("setting") == setting
    assert event_count(database_url) == before


def test_a_runs_history_pages_through_its_stream(
    client: TestClient, admin: Headers, worker: WorkflowWorker
) -> None:
    run_id = start(client, admin, "linear", input={"n": 1}, tags={"team": "red"})
    wait_until(
        lambda: client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["status"] == "succeeded",
        what="the run to succeed",
    )
    whole = client.get(f"/api/v1/runs/{run_id}/history", headers=admin).json()
    assert whole["next"] is None
    types = [e["type"] for e in whole["events"]]
    assert types[0] == "RunStarted"
    assert types[-1] == "RunCompleted"
    assert "team=red" in whole["events"][0]["summary"]
    claims = [e for e in whole["events"] if e["type"] == "NodeClaimed"]
    assert {c["worker"] for c in claims} == {worker.id}
    ends = [e for e in whole["events"] if e["type"] == "NodeSucceeded"]
    assert [(e["attempt"], e["worker"]) for e in ends] == [(1, worker.id)] * len(claims)

    seen: list[int] = []
    after = 0
    while True:
        page = client.get(
            f"/api/v1/runs/{run_id}/history", params={"after": after, "limit": 3}, headers=admin
        )
        assert page.status_code == 200
        body = page.json()
        assert len(body["events"]) <= 3
        seen += [e["version"] for e in body["events"]]
        if body["next"] is None:
            break
        after = body["next"]
    assert seen == [e["version"] for e in whole["events"]]
    assert (
        client.get("/api/v1/runs/00000000-0000-0000-0000-000000000000/history", headers=admin).status_code
        == 404
    )
    assert client.get(f"/api/v1/runs/{run_id}/history", params={"limit": 0}, headers=admin).status_code == 422

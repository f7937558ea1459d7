"""`min_cursor` on reads served from projections: a start followed by a list with its cursor sees the
run, every time; a projection that does not get there in time answers 504 with what it is waiting for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from eventstore import AppendResult, Cursor, NewEvent
from ops.services import Services
from projector import ProjectionBehindError, ProjectorWorker, WorkerSettings, wait_for
from tests.api.helpers import Headers
from tests.waiting import wait_until
from workflows import workflow_tables


@pytest.fixture
def projector(services: Services) -> Iterator[ProjectorWorker]:
    # A long poll interval: the projector follows appends by their notifications, as in production.
    worker = ProjectorWorker(services.store, [workflow_tables], WorkerSettings(poll_interval=5))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # A projection no projector has run yet is answered 409 at once (waiting would not get it there): the
    # tests start once the worker has taken the projection up.
    written = services.store.append("ryw-fixture", [NewEvent("FixtureReady", {})])
    wait_until(lambda: _passed(services, written), what="the projector to take workflow_tables up")
    yield worker
    worker.stop()
    thread.join(10)


def _passed(services: Services, target: AppendResult) -> bool:
    """Whether the projection has been built (its first build done, not merely begun) up to `target`."""
    try:
        wait_for(services.store, workflow_tables, target, timeout=0)
    except ProjectionBehindError:
        return False
    return True


def test_a_started_run_is_in_the_list_read_with_its_cursor(
    client: TestClient, admin: Headers, projector: ProjectorWorker
) -> None:
    for i in range(40):
        started = client.post("/api/v1/workflows/linear/runs", json={"input": {"i": i}}, headers=admin)
        assert started.status_code == 201, started.text
        body = started.json()
        listed = client.get(
            "/api/v1/runs", params={"min_cursor": body["cursor"], "limit": 500}, headers=admin
        )
        assert listed.status_code == 200, listed.text
        assert body["run_id"] in {r["run_id"] for r in listed.json()["runs"]}


def test_an_existing_run_returned_carries_a_cursor_beyond_its_start(
    client: TestClient, admin: Headers, projector: ProjectorWorker
) -> None:
    first = client.post("/api/v1/workflows/linear/runs", json={"key": "k-1"}, headers=admin).json()
    again = client.post("/api/v1/workflows/linear/runs", json={"key": "k-1"}, headers=admin)
    assert again.status_code == 200
    assert Cursor.parse(again.json()["cursor"]) >= Cursor.parse(first["cursor"])
    listed = client.get("/api/v1/runs", params={"min_cursor": again.json()["cursor"]}, headers=admin)
    assert first["run_id"] in {r["run_id"] for r in listed.json()["runs"]}


def test_a_projection_behind_answers_504_naming_what_it_waits_for(
    client: TestClient, admin: Headers, services: Services
) -> None:
    # A projector ran the run tables once, then stopped: they never get to the new run.
    ProjectorWorker(services.store, [workflow_tables]).run_until_caught_up()
    cursor = client.post("/api/v1/workflows/linear/runs", json={}, headers=admin).json()["cursor"]
    began = time.monotonic()
    response = client.get("/api/v1/runs", params={"min_cursor": cursor, "wait": 0.2}, headers=admin)
    # At least the wait asked for; the upper bound only has to tell it from waiting on (margin for load).
    assert 0.2 <= time.monotonic() - began < 10
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "projection_behind"
    assert error["details"]["projection"] == "workflow_tables"
    assert error["details"]["min_cursor"] == cursor
    assert Cursor.parse(error["details"]["position"]) < Cursor.parse(cursor)


def test_a_projection_no_projector_ever_ran_answers_409_at_once(client: TestClient, admin: Headers) -> None:
    cursor = client.post("/api/v1/workflows/linear/runs", json={}, headers=admin).json()["cursor"]
    began = time.monotonic()
    response = client.get("/api/v1/runs", params={"min_cursor": cursor, "wait": 20}, headers=admin)
    assert time.monotonic() - began < 10, "answered at once, not after the 20 s wait"
    assert response.status_code == 409
    assert response.json()["error"]["details"]["position"] is None


def test_a_cursor_beyond_every_write_is_refused(
    client: TestClient, admin: Headers, projector: ProjectorWorker
) -> None:
    response = client.get("/api/v1/runs", params={"min_cursor": f"{2**40}:1"}, headers=admin)
    assert response.status_code == 422
    assert "beyond every committed write" in response.json()["error"]["message"]


@pytest.mark.parametrize("bad", ["1", "a:b", "-1:0", "1:2:3", "9" * 30 + ":1", ""])
def test_a_malformed_cursor_is_refused(client: TestClient, admin: Headers, bad: str) -> None:
    response = client.get("/api/v1/runs", params={"min_cursor": bad}, headers=admin)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_the_wait_is_bounded(client: TestClient, admin: Headers) -> None:
    response = client.get("/api/v1/runs", params={"min_cursor": "1:1", "wait": 31}, headers=admin)
    assert response.status_code == 422

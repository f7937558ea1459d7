"""Projections for operators over HTTP: health, runs, rebuild and verify in the background, replay,
failures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from eventstore import Cursor, NewEvent
from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers
from tests.api.roles import server_admin
from tests.waiting import wait_until


def runs_of(client: TestClient, headers: Headers, name: str) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/projections/{name}/runs", headers=headers)
    assert response.status_code == 200, response.text
    runs: list[dict[str, Any]] = response.json()["runs"]
    return runs


def test_health_lists_every_projection_and_the_horizon(client: TestClient, make_token: Any) -> None:
    body = client.get("/api/v1/projections", headers=make_token("read")).json()
    names = {p["name"]: p for p in body["projections"]}
    assert set(names) == {"stream_catalogue", "workflow_tables"}
    assert names["stream_catalogue"]["state"] == "new"
    assert set(body["horizon"]) == {"xmin", "age_seconds", "waiting_events", "holders"}
    for holder in body["horizon"]["holders"]:
        assert set(holder) == {"pid", "application", "state", "age_seconds"}


@pytest.mark.parametrize("action", ["rebuild", "verify"])
def test_rebuild_and_verify_run_in_the_background(
    client: TestClient, services: Services, action: str
) -> None:
    services.store.append("order-1", [NewEvent("A", {})], tenant="acme")
    ProjectorWorker(services.store, services.projections).run_until_caught_up()
    admin = server_admin(services)
    response = client.post(f"/api/v1/projections/stream_catalogue/{action}", headers=admin)
    assert response.status_code == 202
    accepted = response.json()
    assert set(accepted) == {"run_id", "kind", "note"}
    assert (accepted["kind"], accepted["note"]) == (action, None)

    def completed() -> dict[str, Any] | None:
        [run] = [r for r in runs_of(client, admin, "stream_catalogue") if r["id"] == accepted["run_id"]]
        return run if run["status"] == "completed" else None

    run = wait_until(completed, what=f"the {action} run to complete")
    assert run is not None
    assert run["kind"] == action
    assert run["tenant"] is None  # a server administrator's run covers every tenant
    assert run["actor"].startswith("api:")
    assert run["digest"]


def test_a_second_rebuild_while_one_runs_is_409(client: TestClient, services: Services) -> None:
    from projector import cursor_rows, run_rows

    with services.store.pool.connection() as conn:
        cursor_rows.ensure_cursor(conn, "stream_catalogue", 1)
        run_id = run_rows.start_run(
            conn,
            "stream_catalogue",
            "rebuild",
            trigger="test",
            actor="test",
            owner="elsewhere",
            start=Cursor(),
        )
        conn.execute(  # heartbeating, as a live owner's run does
            "UPDATE ledgerflow.projection_runs SET heartbeat_at = now() + interval '1 hour' WHERE id = %s",
            (run_id,),
        )
    for action in ("rebuild", "verify"):
        response = client.post(
            f"/api/v1/projections/stream_catalogue/{action}", headers=server_admin(services)
        )
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "run_in_progress"
        assert (error["details"]["run_id"], error["details"]["kind"]) == (run_id, "rebuild")
        assert "details.run_id" in error["next"]


def test_replay_moves_the_cursor_back(client: TestClient, services: Services) -> None:
    admin = server_admin(services)
    for i in range(3):
        services.store.append(f"order-{i}", [NewEvent("A", {})], tenant="acme")
    first = ProjectorWorker(services.store, services.projections)
    first.run_until_caught_up()
    first.release_all()

    response = client.post(
        "/api/v1/projections/stream_catalogue/replay", json={"after": "0:0"}, headers=admin
    )
    assert response.status_code == 202
    assert response.json()["kind"] == "replay"  # stream_catalogue replays in place
    run_id = response.json()["run_id"]
    [run] = [r for r in runs_of(client, admin, "stream_catalogue") if r["id"] == run_id]
    assert run["kind"] == "replay"
    assert run["status"] == "running"

    def replayed() -> bool:
        projector.run_until_caught_up()
        return any(
            r["id"] == run_id and r["status"] == "completed"
            for r in runs_of(client, admin, "stream_catalogue")
        )

    projector = ProjectorWorker(services.store, services.projections)  # picks up the replay
    wait_until(replayed, what="the replay to complete")
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    response = client.post(
        "/api/v1/projections/stream_catalogue/replay", json={"since": since}, headers=admin
    )
    assert response.status_code == 202
    projector.release_all()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"after": "0:0", "since": "2024-01-01T00:00:00Z"},
        {"after": "x"},
        {"since": "2024-01-01T00:00:00"},  # no time zone
        {"since": "2024-01-01"},
        {"since": 1700000000},  # a number is not the RFC 3339 time the field documents
        {"since": 1700000000.5},
        {"since": "1700000000"},
        {"since": True},
        {"after": "0:0", "extra": 1},
    ],
)
def test_bad_replays_are_422(client: TestClient, admin: Headers, body: dict[str, Any]) -> None:
    response = client.post("/api/v1/projections/stream_catalogue/replay", json=body, headers=admin)
    assert response.status_code == 422, response.text


def test_a_replay_not_behind_the_cursor_is_422(client: TestClient, services: Services) -> None:
    # An in-place replay (the server administrator's, over every tenant) checks the cursor; a tenant's
    # replay rebuilds its rows whatever the cursor, and so learns nothing about the shared log.
    response = client.post(
        "/api/v1/projections/stream_catalogue/replay", json={"after": "5:5"}, headers=server_admin(services)
    )
    assert response.status_code == 422
    assert "not behind" in response.json()["error"]["message"]


def test_unknown_projections_are_404(client: TestClient, admin: Headers) -> None:
    for method, path in [
        ("GET", "/api/v1/projections/nope/runs"),
        ("POST", "/api/v1/projections/nope/rebuild"),
        ("POST", "/api/v1/projections/nope/verify"),
        ("GET", "/api/v1/failures?projection=nope"),
    ]:
        response = client.request(method, path, headers=admin)
        assert response.status_code == 404, path
        assert "stream_catalogue" in response.json()["error"]["message"]  # names the known ones


def test_failures_are_listed_and_resolved(client: TestClient, admin: Headers, services: Services) -> None:
    from projector import failure_rows

    services.store.append("order-1", [NewEvent("A", {})], tenant="acme")
    [event] = services.store.read_stream("order-1", tenant="acme")
    with services.store.pool.connection() as conn:
        failure_id = failure_rows.record_failure(
            conn, "stream_catalogue", event, "block", ValueError("boom"), 3
        )

    [failure] = client.get("/api/v1/failures", headers=admin).json()["failures"]
    assert (failure["id"], failure["stream_id"], failure["error_message"]) == (failure_id, "order-1", "boom")
    assert client.get("/api/v1/failures?projection=workflow_tables", headers=admin).json() == {"failures": []}

    retried = client.post(f"/api/v1/failures/{failure_id}/retry", headers=admin)
    assert retried.json() == {"id": failure_id, "requested": "retry"}
    assert client.post(f"/api/v1/failures/{failure_id}/retry", headers=admin).status_code == 404  # not open
    assert client.post(f"/api/v1/failures/{failure_id}/skip", headers=admin).status_code == 200
    # The projector holding the lease carries the skip out; until then the failure shows what was asked.
    [pending] = client.get("/api/v1/failures", headers=admin).json()["failures"]
    assert pending["status"] == "skip_requested"
    assert pending["resolved_by"].startswith("api:")
    assert client.post("/api/v1/failures/999/skip", headers=admin).status_code == 404
    assert client.post("/api/v1/failures/0/skip", headers=admin).status_code == 422

"""Pausing and resuming a run over HTTP: idempotent answers, 409 for an ended run, 404 for another
tenant's run, and nothing written by a refusal."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.helpers import Headers, MakeToken, event_count
from tests.api.test_runs import start


def test_pause_and_resume(client: TestClient, admin: Headers, database_url: str) -> None:
    run_id = start(client, admin, "linear")
    paused = client.post(f"/api/v1/runs/{run_id}/pause", headers=admin)
    assert paused.status_code == 200
    assert paused.json()["status"] == "paused"
    before = event_count(database_url)
    again = client.post(f"/api/v1/runs/{run_id}/pause", json={"interrupt_running": True}, headers=admin)
    assert again.status_code == 200
    assert again.json()["status"] == "paused"
    assert event_count(database_url) == before  # paused already, and nothing runs: nothing recorded

    resumed = client.post(f"/api/v1/runs/{run_id}/resume", headers=admin)
    assert resumed.status_code == 200
    assert resumed.json()["status"] == "running"
    assert client.post(f"/api/v1/runs/{run_id}/resume", headers=admin).json()["status"] == "running"


def test_pause_refuses_ended_runs_and_other_tenants(
    client: TestClient, admin: Headers, make_token: MakeToken, database_url: str
) -> None:
    run_id = start(client, admin, "linear")
    other = make_token("admin", tenant="other")
    for action in ("pause", "resume"):
        assert client.post(f"/api/v1/runs/{run_id}/{action}", headers=other).status_code == 404
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin).status_code == 200
    before = event_count(database_url)
    for action in ("pause", "resume"):
        refused = client.post(f"/api/v1/runs/{run_id}/{action}", headers=admin)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "run_state_conflict"
    assert event_count(database_url) == before
    bad = client.post(f"/api/v1/runs/{run_id}/pause", json={"interrupt_running": "yes please"}, headers=admin)
    assert bad.status_code == 422

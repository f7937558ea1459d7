"""Bulk cancel, retry, pause and resume over HTTP: a dry run counts, an action is recorded at once (202)
and worked in the background, its progress read by id; the limit is a 422 that records nothing; a reader
may not act; another tenant neither sees the action nor has its runs touched."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers, MakeToken
from tests.waiting import wait_until


def start(client: TestClient, headers: Headers, **body: Any) -> str:
    response = client.post("/api/v1/workflows/linear/runs", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["run_id"])


def status_of(client: TestClient, headers: Headers, run_id: str) -> str:
    response = client.get(f"/api/v1/runs/{run_id}", headers=headers)
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


def test_bulk_cancel_over_http(client: TestClient, make_token: MakeToken, services: Services) -> None:
    acme, globex = make_token("operate", "read"), make_token("operate", "read", tenant="globex")
    chosen = [start(client, acme, tags={"batch": "x"}) for _ in range(4)]
    kept = start(client, acme, tags={"batch": "y"})
    theirs = start(client, globex, tags={"batch": "x"})
    ProjectorWorker(services.store, services.projections).run_until_caught_up()
    body = {"tag": ["batch=x"]}

    dry = client.post("/api/v1/runs/bulk/cancel", json={**body, "dry_run": True}, headers=acme)
    assert dry.status_code == 202, dry.text
    assert (dry.json()["matched"], dry.json()["id"], dry.json()["state"]) == (4, None, "dry_run")
    reader = client.post("/api/v1/runs/bulk/cancel", json=body, headers=make_token("read"))
    assert reader.status_code == 403
    unknown = client.post("/api/v1/runs/bulk/explode", json=body, headers=acme)
    assert unknown.status_code == 422
    assert "unknown bulk action" in unknown.text
    bad = client.post("/api/v1/runs/bulk/cancel", json={"tags": ["batch=x"]}, headers=acme)
    assert bad.status_code == 422

    accepted = client.post("/api/v1/runs/bulk/cancel", json=body, headers=acme)
    assert accepted.status_code == 202, accepted.text
    action_id = accepted.json()["id"]
    assert accepted.json()["matched"] == 4

    def ended() -> dict[str, Any] | None:
        got = client.get(f"/api/v1/runs/bulk/{action_id}", headers=acme)
        assert got.status_code == 200, got.text
        value: dict[str, Any] = got.json()
        return value if value["state"] != "running" else None

    final = wait_until(ended, what="the bulk action's end")
    assert (final["state"], final["done"], final["failed"], final["skipped"]) == ("completed", 4, 0, 0)
    assert final["filter"]["tags"] == [["batch", "x"]]
    assert all(status_of(client, acme, r) == "cancelled" for r in chosen)
    assert status_of(client, acme, kept) == "running"
    assert status_of(client, globex, theirs) == "running"
    assert client.get(f"/api/v1/runs/bulk/{action_id}", headers=globex).status_code == 404
    again = client.post(f"/api/v1/runs/bulk/{action_id}/continue", headers=acme)
    assert again.status_code == 202, again.text
    assert again.json()["done"] == 4
    assert client.post(f"/api/v1/runs/bulk/{action_id}/continue", headers=globex).status_code == 404


def test_more_runs_than_the_limit_is_a_422_that_records_nothing(
    client: TestClient, make_token: MakeToken, services: Services
) -> None:
    acme = make_token("operate", "read")
    runs = [start(client, acme, tags={"batch": "x"}) for _ in range(3)]
    ProjectorWorker(services.store, services.projections).run_until_caught_up()
    services.settings.bulk_max_runs = 2
    refused = client.post("/api/v1/runs/bulk/retry", json={"tag": ["batch=x"]}, headers=acme)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "bulk_limit"
    assert refused.json()["error"]["details"]["limit"] == 2
    assert "LEDGERFLOW_BULK_MAX_RUNS" in refused.text
    with services.store.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM ledgerflow.bulk_actions").fetchone() == (0,)
    assert all(status_of(client, acme, r) == "running" for r in runs)


def test_bulk_pause_then_bulk_resume_of_the_paused_runs_over_http(
    client: TestClient, make_token: MakeToken, services: Services
) -> None:
    acme = make_token("operate", "read")
    chosen = [start(client, acme, tags={"batch": "p"}) for _ in range(3)]
    kept = start(client, acme, tags={"batch": "q"})
    project = ProjectorWorker(services.store, services.projections).run_until_caught_up

    def act(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        accepted = client.post(f"/api/v1/runs/bulk/{kind}", json=body, headers=acme)
        assert accepted.status_code == 202, accepted.text
        action_id = accepted.json()["id"]

        def ended() -> dict[str, Any] | None:
            value: dict[str, Any] = client.get(f"/api/v1/runs/bulk/{action_id}", headers=acme).json()
            return value if value["state"] != "running" else None

        return wait_until(ended, what=f"the bulk {kind}'s end")

    project()
    paused = act("pause", {"tag": ["batch=p"]})
    assert (paused["kind"], paused["done"], paused["skipped"]) == ("pause", 3, 0)
    assert [status_of(client, acme, r) for r in [*chosen, kept]] == ["paused"] * 3 + ["running"]
    project()
    wanted = {"status": ["paused"]}
    dry = client.post("/api/v1/runs/bulk/resume", json={**wanted, "dry_run": True}, headers=acme)
    assert dry.json()["matched"] == 3
    resumed = act("resume", wanted)
    assert (resumed["done"], resumed["skipped"]) == (3, 0)
    assert all(status_of(client, acme, r) == "running" for r in chosen)

"""A run retention released, over HTTP: its detail says when and by whom, `restore` brings it back (409
for a run not released, 404 for another tenant's run), and nothing is written by a refusal."""

from __future__ import annotations

import uuid
from datetime import timedelta

from fastapi.testclient import TestClient

from ops.services import Services
from tests.api.helpers import Headers, MakeToken, event_count
from tests.api.test_runs import start
from workflows import release_of, release_run


def test_a_released_run_is_found_by_id_and_restored(
    client: TestClient, admin: Headers, make_token: MakeToken, services: Services, database_url: str
) -> None:
    run_id = start(client, admin, "linear")
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin).status_code == 200
    assert client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["released"] is None
    before = event_count(database_url)
    refused = client.post(f"/api/v1/runs/{run_id}/restore", headers=admin)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "run_state_conflict"
    assert event_count(database_url) == before

    release_run(
        services.engine, uuid.UUID(run_id), tenant="acme", default=timedelta(microseconds=1), actor="test"
    )
    released = client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert released["released"]["actor"] == "test"
    assert released["status"] == "cancelled", "still found by id, from its stream"

    other = make_token("admin", tenant="other")
    assert client.post(f"/api/v1/runs/{run_id}/restore", headers=other).status_code == 404
    restored = client.post(f"/api/v1/runs/{run_id}/restore", headers=admin)
    assert restored.status_code == 200, restored.text
    assert restored.json()["released"] is None
    assert release_of(services.store, uuid.UUID(run_id), tenant="acme") is None

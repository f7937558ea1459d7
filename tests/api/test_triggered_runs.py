"""The run detail names the log event that started a run (a trigger) and its cursor."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ops.services import Services
from tests.api.helpers import Headers
from workflows import event_models as em


def test_a_triggered_run_shows_its_event_and_cursor(
    client: TestClient, admin: Headers, services: Services
) -> None:
    by = em.TriggeringEvent(
        event_id="e1", stream_id="order-1", type="OrderPlaced", transaction_id=7, position=3
    )
    triggered = services.engine.start("linear", input={"n": 1}, tenant="acme", triggered_by=by)
    plain = services.engine.start("linear", input={"n": 1}, tenant="acme")
    body = client.get(f"/api/v1/runs/{triggered.run_id}", headers=admin).json()
    assert body["triggered_by"] == by.model_dump()
    assert client.get(f"/api/v1/runs/{plain.run_id}", headers=admin).json()["triggered_by"] is None

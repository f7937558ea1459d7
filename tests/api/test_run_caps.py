"""Caps on what one run may hold, over HTTP: a signal payload or an input over its cap is a 413, one
signal too many for a run a 409, each with the JSON error shape naming the setting, and nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.services import Services
from tests.api.helpers import Headers, event_count
from workflows import RunCaps


def reread_caps(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process reads its caps once, when it builds its engine: read them again after a setting changed."""
    monkeypatch.setattr(services.engine, "caps", RunCaps())


def test_every_request_goes_through_the_one_engine_the_process_built(services: Services) -> None:
    engine = services.engine
    assert services.engine is engine  # its caps and tag limits are read from the environment once
    assert engine.quotas is services.quotas


def start(client: TestClient, headers: Headers, body: dict[str, Any] | None = None) -> Any:
    return client.post("/api/v1/workflows/approval/runs", json=body or {}, headers=headers)


def signal(client: TestClient, headers: Headers, run_id: str, payload: Any, **kw: Any) -> Any:
    return client.post(f"/api/v1/runs/{run_id}/signals/approve", json=payload, headers=headers, **kw)


def test_a_signal_payload_over_its_cap_is_a_413_and_writes_nothing(
    client: TestClient, admin: Headers, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERFLOW_MAX_SIGNAL_BYTES", "1000")
    reread_caps(services, monkeypatch)
    run_id = start(client, admin).json()["run_id"]
    before = event_count(services.store.url)
    response = signal(client, admin, run_id, {"note": "x" * 1000})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large"
    assert error["details"] == {"size": 1011, "limit": 1000, "setting": "LEDGERFLOW_MAX_SIGNAL_BYTES"}
    assert "LEDGERFLOW_MAX_SIGNAL_BYTES" in error["message"]
    assert event_count(services.store.url) == before
    assert signal(client, admin, run_id, {"note": "x" * 980}).status_code == 201  # 991 bytes: within


def test_one_signal_past_the_cap_per_run_is_a_409_and_writes_nothing(
    client: TestClient, admin: Headers, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERFLOW_MAX_SIGNALS_PER_RUN", "3")
    reread_caps(services, monkeypatch)
    run_id = start(client, admin).json()["run_id"]
    first = signal(client, {**admin, "Idempotency-Key": "first"}, run_id, 0)
    assert first.status_code == 201, first.text
    for n in (1, 2):
        assert signal(client, admin, run_id, n).status_code == 201
    before = event_count(services.store.url)
    refused = signal(client, admin, run_id, 3)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "run_signal_limit"
    assert error["details"]["setting"] == "LEDGERFLOW_MAX_SIGNALS_PER_RUN"
    assert error["details"]["limit"] == 3
    assert event_count(services.store.url) == before
    # A repeat of an earlier send is not a new signal: it gets that send's answer.
    again = signal(client, {**admin, "Idempotency-Key": "first"}, run_id, 0)
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True
    # The cap is per run: another run takes signals.
    other = start(client, admin).json()["run_id"]
    assert signal(client, admin, other, 0).status_code == 201


def test_an_input_over_its_cap_is_a_413_for_a_start_and_a_refresh(
    client: TestClient, admin: Headers, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGERFLOW_MAX_INPUT_BYTES", "2000")
    reread_caps(services, monkeypatch)
    run_id = start(client, admin).json()["run_id"]
    before = event_count(services.store.url)
    response = start(client, admin, {"input": {"text": "x" * 2000}})
    assert response.status_code == 413, response.text
    assert response.json()["error"]["details"]["setting"] == "LEDGERFLOW_MAX_INPUT_BYTES"
    refreshed = client.post(f"/api/v1/runs/{run_id}/refresh", json={"input": ["y" * 2000]}, headers=admin)
    assert refreshed.status_code == 413, refreshed.text
    assert refreshed.json()["error"]["code"] == "payload_too_large"
    assert event_count(services.store.url) == before

"""Run priorities over HTTP and the CLI: given at the start, recorded in RunStarted, shown in run reads."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from ops.cli.commands import cli
from tests.api.helpers import Headers, event_count


def test_a_start_takes_a_priority_and_the_run_shows_it(client: TestClient, admin: Headers) -> None:
    started = client.post("/api/v1/workflows/linear/runs", json={"priority": 7}, headers=admin)
    assert started.status_code == 201, started.text
    run = client.get(f"/api/v1/runs/{started.json()['run_id']}", headers=admin).json()
    assert run["priority"] == 7
    plain = client.post("/api/v1/workflows/linear/runs", json={}, headers=admin).json()
    assert client.get(f"/api/v1/runs/{plain['run_id']}", headers=admin).json()["priority"] == 0


@pytest.mark.parametrize("priority", ["high", 1.5, True, 2**31, -(2**31) - 1])
def test_a_bad_priority_is_422_and_writes_nothing(
    client: TestClient, admin: Headers, database_url: str, priority: Any
) -> None:
    response = client.post("/api/v1/workflows/linear/runs", json={"priority": priority}, headers=admin)
    assert response.status_code == 422, response.text
    assert "error" in response.json()
    assert event_count(database_url) == 0


def test_the_cli_starts_with_a_priority(database_url: str) -> None:
    runner = CliRunner()
    env = {"LEDGERFLOW_DATABASE_URL": database_url, "LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
    started = runner.invoke(cli, ["workflows", "start", "linear", "--priority", "3", "--print-id"], env=env)
    assert started.exit_code == 0, started.output
    run_id = started.output.strip().splitlines()[-1]
    shown = runner.invoke(cli, ["workflows", "show", run_id, "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert '"priority": 3' in shown.output
    bad = runner.invoke(cli, ["workflows", "start", "linear", "--priority", "soon"], env=env)
    assert bad.exit_code != 0
    assert "--priority" in bad.output
    assert event_count(database_url) == 2  # the run's RunStarted and NodesReady only

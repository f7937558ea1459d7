"""What the console reads beyond the run detail: one node with its output and error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.services import Services
from tests.api.helpers import Headers, MakeToken
from tests.waiting import wait_until
from workflows import WorkerSettings, WorkflowWorker
from workflows.testing import running_worker


@pytest.fixture
def worker(services: Services) -> Iterator[WorkflowWorker]:
    with running_worker(
        services.engine,
        services.registry,
        WorkerSettings(concurrency=2, poll_interval=0.05, shutdown_grace=2),
        name="console-data-worker",
    ) as w:
        yield w


def start(client: TestClient, headers: Headers, workflow: str, input: Any = None) -> str:
    response = client.post(f"/api/v1/workflows/{workflow}/runs", json={"input": input}, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["run_id"])


def finished(client: TestClient, headers: Headers, run_id: str) -> dict[str, Any] | None:
    run: dict[str, Any] = client.get(f"/api/v1/runs/{run_id}", headers=headers).json()
    return run if run["status"] != "running" else None


def test_a_node_shows_its_output_once_it_succeeded(
    client: TestClient, admin: Headers, worker: WorkflowWorker
) -> None:
    run_id = start(client, admin, "diamond")
    wait_until(lambda: finished(client, admin, run_id), what="the diamond run to finish")
    outputs = {}
    for name in ("source", "left", "right", "join"):
        response = client.get(f"/api/v1/runs/{run_id}/nodes/{name}", headers=admin)
        assert response.status_code == 200, response.text
        node = response.json()
        assert (node["name"], node["status"], node["run_id"]) == (name, "succeeded", run_id)
        outputs[name] = node["output"]
    assert outputs == {"source": [1, 2, 3], "left": 6, "right": 3, "join": 9}
    join = client.get(f"/api/v1/runs/{run_id}/nodes/join", headers=admin).json()
    assert join["depends_on"] == ["left", "right"]
    # The polled run detail stays small: outputs are only in the node's own resource.
    assert all("output" not in n for n in client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["nodes"])


def test_a_failed_node_shows_its_error_and_no_output(
    client: TestClient, admin: Headers, worker: WorkflowWorker
) -> None:
    run_id = start(client, admin, "flaky", {"fail_times": 3})
    run = wait_until(lambda: finished(client, admin, run_id), what="the flaky run to fail")
    assert run is not None
    assert run["status"] == "failed"
    node = client.get(f"/api/v1/runs/{run_id}/nodes/flaky", headers=admin).json()
    assert node["status"] == "failed"
    assert node["attempt"] == 3
    assert "attempt 3 fails on purpose" in node["error"]
    assert node["output"] is None
    waiting = client.get(f"/api/v1/runs/{run_id}/nodes/after_flaky", headers=admin).json()
    assert (waiting["status"], waiting["output"], waiting["error"]) == ("pending", None, None)


def test_unknown_nodes_and_other_tenants_runs_are_404(
    client: TestClient, admin: Headers, make_token: MakeToken
) -> None:
    run_id = start(client, admin, "linear")
    unknown = client.get(f"/api/v1/runs/{run_id}/nodes/fourth", headers=admin)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"
    assert "first, second, third" in unknown.json()["error"]["message"]
    other_tenant = make_token("read", tenant="globex")
    assert client.get(f"/api/v1/runs/{run_id}/nodes/first", headers=other_tenant).status_code == 404
    assert client.get(f"/api/v1/runs/{run_id}/nodes/first").status_code == 401

"""Workflows and runs over HTTP: the DAG, starting runs, run detail, cancel, retry, refresh."""

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
from workflows.event_models import ParentLink
from workflows.testing import running_worker


@pytest.fixture
def worker(services: Services) -> Iterator[WorkflowWorker]:
    with running_worker(
        services.engine,
        services.registry,
        WorkerSettings(concurrency=4, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2),
        name="api-test-worker",
    ) as w:
        yield w


def start(client: TestClient, headers: Headers, workflow: str, **body: Any) -> str:
    response = client.post(f"/api/v1/workflows/{workflow}/runs", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["run_id"])


def detail(client: TestClient, headers: Headers, run_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/runs/{run_id}", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def finished(client: TestClient, headers: Headers, run_id: str) -> dict[str, Any] | None:
    run = detail(client, headers, run_id)
    return run if run["status"] != "running" else None


def test_workflows_are_listed_with_their_dag(client: TestClient, admin: Headers) -> None:
    workflows = {w["name"]: w for w in client.get("/api/v1/workflows", headers=admin).json()["workflows"]}
    diamond = workflows["diamond"]
    assert [n["name"] for n in diamond["nodes"]] == ["source", "left", "right", "join"]
    assert {n["name"]: n["depends_on"] for n in diamond["nodes"]}["join"] == ["left", "right"]
    assert diamond["roots"] == ["source"]


def test_starting_a_run_with_keys(client: TestClient, admin: Headers, services: Services) -> None:
    url = "/api/v1/workflows/linear/runs"
    first = client.post(url, json={"input": {"n": 2}, "key": "batch-7"}, headers=admin)
    assert first.status_code == 201
    assert first.json()["created"] is True
    same_key = client.post(url, json={"input": {"n": 3}, "key": "batch-7"}, headers=admin)
    assert same_key.status_code == 200
    assert same_key.json() == {
        "run_id": first.json()["run_id"],
        "created": False,
        "cursor": same_key.json()["cursor"],  # beyond the start: see tests/api/test_read_your_writes.py
    }

    idem = {**admin, "Idempotency-Key": "start-1"}
    once = client.post(url, json={"input": {"n": 1}}, headers=idem)
    twice = client.post(url, json={"input": {"n": 1}}, headers=idem)
    assert (once.status_code, twice.status_code) == (201, 200)
    assert once.json()["run_id"] == twice.json()["run_id"]
    other = client.post(url, json={"input": {"n": 9}}, headers=idem)
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"


@pytest.mark.parametrize(
    ("workflow", "body", "status"),
    [
        ("no_such_flow", {}, 404),
        ("linear", {"key": ""}, 422),
        ("linear", {"key": "k" * 201}, 422),
        ("linear", {"input": 1, "surprise": True}, 422),
    ],
)
def test_refused_starts_write_nothing(
    client: TestClient, admin: Headers, database_url: str, workflow: str, body: dict[str, Any], status: int
) -> None:
    response = client.post(f"/api/v1/workflows/{workflow}/runs", json=body, headers=admin)
    assert response.status_code == status, response.text
    assert event_count(database_url) == 0


def test_input_json_cannot_carry_is_422(client: TestClient, admin: Headers, database_url: str) -> None:
    response = client.post(
        "/api/v1/workflows/linear/runs",
        content=b'{"input": {"x": NaN}}',
        headers={**admin, "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert event_count(database_url) == 0


def test_run_detail_has_every_node_and_the_dag(client: TestClient, admin: Headers) -> None:
    run_id = start(client, admin, "diamond")
    run = detail(client, admin, run_id)
    assert run["workflow"] == "diamond"
    assert run["status"] == "running"
    assert run["definition_known"]
    assert [n["name"] for n in run["nodes"]] == ["source", "left", "right", "join"]
    assert {n["name"]: n["status"] for n in run["nodes"]} == {
        "source": "ready",
        "left": "pending",
        "right": "pending",
        "join": "pending",
    }
    assert sorted((e["source"], e["target"]) for e in run["edges"]) == [
        ("left", "join"),
        ("right", "join"),
        ("source", "left"),
        ("source", "right"),
    ]
    node = run["nodes"][0]
    assert set(node) >= {"status", "attempt", "progress", "error", "generation", "checkpoints", "depends_on"}
    assert run["parent"] is None


def test_a_child_run_names_its_parent(client: TestClient, admin: Headers, services: Services) -> None:
    parent = start(client, admin, "diamond")
    link = ParentLink(run_id=parent, node="source", parent_close="abandon")
    child = services.engine.start("diamond", input=None, parent=link, tenant="acme").run_id
    assert detail(client, admin, str(child))["parent"] == {
        "run_id": parent,
        "node": "source",
        "parent_close": "abandon",
    }


def test_a_continued_run_and_its_successor_link_each_other(
    client: TestClient, admin: Headers, worker: WorkflowWorker
) -> None:
    first = start(client, admin, "countdown", input={"n": 1})
    ended = wait_until(lambda: finished(client, admin, first), timeout=30, what="the run to continue")
    assert ended["status"] == "continued"
    assert ended["continued_from"] is None
    successor = ended["continued_as"]
    after = wait_until(lambda: finished(client, admin, successor), timeout=30, what="its successor to end")
    assert after["status"] == "succeeded"
    assert after["continued_from"] == first
    assert after["continued_as"] is None
    listed = client.get("/api/v1/runs?status=continued", headers=admin)
    assert listed.status_code == 200, listed.text


def test_a_finished_run_shows_progress_attempts_and_generations(
    client: TestClient, admin: Headers, services: Services, worker: WorkflowWorker
) -> None:
    run_id = start(client, admin, "drill", input={"items": 3})
    run = wait_until(lambda: finished(client, admin, run_id), what="the run to finish")
    assert run is not None
    assert run["status"] == "succeeded"
    nodes = {n["name"]: n for n in run["nodes"]}
    assert nodes["expensive"]["progress"] == {"current": 1, "total": 2, "message": "between steps"}
    assert nodes["expensive"]["steps"] == 2
    assert nodes["work_items"]["checkpoints"] == 3
    assert all(n["attempt"] == 1 and n["generation"] == 1 for n in nodes.values())

    projector = ProjectorWorker(services.store, services.projections)

    def listed_runs() -> list[dict[str, Any]]:
        projector.run_until_caught_up()
        runs: list[dict[str, Any]] = client.get(
            "/api/v1/runs", params={"status": "succeeded"}, headers=admin
        ).json()["runs"]
        return runs

    listed = wait_until(listed_runs, what="the run table to show the run")
    projector.release_all()
    assert [r["run_id"] for r in listed] == [run_id]
    assert listed[0]["nodes_done"] == listed[0]["nodes_total"] == 4


def test_refresh_reruns_only_what_changed(client: TestClient, admin: Headers, worker: WorkflowWorker) -> None:
    run_id = start(client, admin, "linear", input={"n": 1})
    wait_until(lambda: finished(client, admin, run_id), what="the run to finish")
    unchanged = client.post(f"/api/v1/runs/{run_id}/refresh", json={"input": {"n": 1}}, headers=admin)
    assert unchanged.status_code == 200
    assert unchanged.json() == {"run_id": run_id, "rerun": []}
    changed = client.post(f"/api/v1/runs/{run_id}/refresh", json={"input": {"n": 2}}, headers=admin)
    assert changed.json()["rerun"] == ["first", "second", "third"]
    run = wait_until(lambda: finished(client, admin, run_id), what="the refreshed run to finish")
    assert run is not None
    assert run["status"] == "succeeded"
    assert run["input"] == {"n": 2}


def test_cancel_and_retry(client: TestClient, admin: Headers, database_url: str) -> None:
    run_id = start(client, admin, "linear")
    assert client.post(f"/api/v1/runs/{run_id}/retry", headers=admin).status_code == 409  # still running
    assert client.post(f"/api/v1/runs/{run_id}/refresh", json={}, headers=admin).status_code == 409

    cancelled = client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin)
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    before = event_count(database_url)
    again = client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "run_state_conflict"
    assert event_count(database_url) == before

    retried = client.post(f"/api/v1/runs/{run_id}/retry", headers=admin)
    assert retried.status_code == 200
    assert retried.json()["status"] == "running"


def test_unknown_runs_are_404(client: TestClient, admin: Headers) -> None:
    missing = "00000000-0000-0000-0000-0000000000ff"
    assert client.get(f"/api/v1/runs/{missing}", headers=admin).status_code == 404
    for action in ("cancel", "retry", "refresh"):
        assert client.post(f"/api/v1/runs/{missing}/{action}", headers=admin).status_code == 404
    assert client.get("/api/v1/runs/not-a-uuid", headers=admin).status_code == 422


def test_run_list_filters_are_checked(client: TestClient, admin: Headers) -> None:
    no_table = client.get("/api/v1/runs", headers=admin).json()
    assert no_table == {"runs": [], "next": None}  # no projector yet: no table
    assert client.get("/api/v1/runs", params={"status": "exploded"}, headers=admin).status_code == 422
    assert client.get("/api/v1/runs", params={"limit": 0}, headers=admin).status_code == 422


def test_recovery_reports_the_queue(client: TestClient, admin: Headers) -> None:
    start(client, admin, "linear")
    report = client.get("/api/v1/recovery", headers=admin).json()
    assert report["queue"] == {"ready": 1, "running": 0, "orphaned": 0, "parked": 0}
    assert report["recent"] == []

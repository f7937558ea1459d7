"""The restart drill: `ledgerflow serve` killed with SIGKILL mid-work, started again, and checked item by
item through the API, as an operator would after a restart:

- /api/healthz answers 200;
- projection health answers for the tenant, and projections are current or progressing;
- no failure blocks normal operation;
- events written before the crash can still be read;
- workflow runs from before the crash can still be read, and the interrupted ones complete.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventstore import EventStore
from ops.auth import create_token
from tests.acceptance.serve_process import free_port, healthy, start_serve
from tests.waiting import wait_until

pytestmark = pytest.mark.drill


#: Short leases, so that the killed server's nodes and projections are taken back soon after its restart.
RESTART_SETTINGS = {
    "WORKER_NAME": "restart-drill",
    "WORKFLOW_LEASE_TTL": "2",
    "WORKFLOW_HEARTBEAT_INTERVAL": "0.5",
    "PROJECTOR_LEASE_TTL": "2",
    "PROJECTOR_HEARTBEAT_INTERVAL": "0.5",
}


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def client(store: EventStore, port: int) -> Iterator[httpx.Client]:
    _, token = create_token(store, tenant="default", scopes=["admin"], name="drill")
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        yield client


def test_serve_is_healthy_after_a_crash_and_restart(
    store: EventStore, client: httpx.Client, port: int, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    server = start_serve(store.url, port, log, **RESTART_SETTINGS)
    try:
        wait_until(lambda: healthy(client), timeout=60, what="serve to answer")
        appended = client.post(
            "/api/v1/streams/trace-1/events",
            json={"events": [{"type": "TraceRecorded", "data": {"step": 1}}]},
        )
        assert appended.status_code == 201, appended.text
        runs = [
            client.post("/api/v1/workflows/drill/runs", json={"input": {"items": 10}}).json()["run_id"]
            for _ in range(4)
        ]
        # Kill it while nodes run.
        wait_until(
            lambda: any(
                client.get(f"/api/v1/runs/{r}").json()["status"] == "running"
                and _any_node(client.get(f"/api/v1/runs/{r}").json(), "running")
                for r in runs
            ),
            timeout=60,
            what="nodes to run",
        )
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()

    server = start_serve(store.url, port, log, **RESTART_SETTINGS)
    try:
        wait_until(lambda: healthy(client), timeout=60, what="serve to answer after the restart")
        # Interrupted runs are taken back at start-up and complete.
        wait_until(
            lambda: all(client.get(f"/api/v1/runs/{r}").json()["status"] == "succeeded" for r in runs),
            timeout=90,
            what="the interrupted runs to complete",
        )
        # The killed process's projector leases lapse after their TTL (2 s here); then the new process's
        # projector holds them. (Runs may complete sooner: workers take their own nodes back at once.)
        states = wait_until(
            lambda: (
                (s := _projection_states(client))
                and all(v in ("running", "catching_up") for v in s.values())
                and s
            ),
            timeout=30,
            what="the projections to run again",
        )
        assert set(states) >= {"stream_catalogue", "workflow_tables"}
        failures = client.get("/api/v1/failures")
        assert failures.status_code == 200
        assert failures.json()["failures"] == [], "a failure blocks normal operation"
        trace = client.get("/api/v1/streams/trace-1")
        assert [e["data"] for e in trace.json()["events"]] == [{"step": 1}]
        listed = wait_until(lambda: _listed(client, runs), timeout=60, what="the run table to show the runs")
        assert listed
        recovery = client.get("/api/v1/recovery").json()
        assert recovery["recent"], "the start-up recovery is recorded"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0


def _projection_states(client: httpx.Client) -> dict[str, str]:
    projections = client.get("/api/v1/projections")
    assert projections.status_code == 200
    return {p["name"]: p["state"] for p in projections.json()["projections"]}


def _any_node(run: dict[str, Any], status: str) -> bool:
    return any(n["status"] == status for n in run["nodes"])


def _listed(client: httpx.Client, runs: list[str]) -> bool:
    listed = {
        r["run_id"]: r["status"] for r in client.get("/api/v1/runs", params={"limit": 50}).json()["runs"]
    }
    return all(listed.get(r) == "succeeded" for r in runs)

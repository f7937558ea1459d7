"""Operator levers pulled on a real `ledgerflow serve` with two tenants, as operators (and the wrong
operators) pull them: a tenant's admin cannot replay, rebuild or verify the tables every tenant reads;
the server administrator can, on every built-in, and each projection then runs on with no failure and
verifies equal; an in-place replay starts without waiting for a new append; concurrent verifies run one
at a time and leave no scratch schema behind."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventstore import EventStore
from ops.auth import create_token
from projector import run_rows
from tests.acceptance.serve_process import free_port, healthy, start_serve
from tests.waiting import joined, wait_until

pytestmark = pytest.mark.drill


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def served(store: EventStore, tmp_path: Path) -> Iterator[httpx.Client]:
    port = free_port()
    server = start_serve(store.url, port, tmp_path / "serve.log")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        try:
            wait_until(lambda: healthy(client), timeout=60, what="serve to answer")
            yield client
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


def run_of(client: httpx.Client, headers: dict[str, str], projection: str, run_id: int) -> dict[str, Any]:
    runs = client.get(f"/api/v1/projections/{projection}/runs", params={"limit": 200}, headers=headers)
    assert runs.status_code == 200, runs.text
    return next(r for r in runs.json()["runs"] if r["id"] == run_id)


def ended(client: httpx.Client, headers: dict[str, str], projection: str, run_id: int) -> dict[str, Any]:
    return wait_until(
        lambda: (r := run_of(client, headers, projection, run_id))["status"] != "running" and r,
        timeout=60,
        what=f"run {run_id} of {projection} to end",
    )


def health(client: httpx.Client, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    body = client.get("/api/v1/projections", headers=headers).json()
    return {p["name"]: p for p in body["projections"]}


def test_levers_on_every_built_in_by_the_right_and_the_wrong_administrator(
    store: EventStore, served: httpx.Client
) -> None:
    client = served
    _, server_secret = create_token(store, tenant="default", scopes=["admin"], name="ops", server_admin=True)
    server = bearer(server_secret)
    tenants = {
        who: bearer(create_token(store, tenant=who, scopes=["admin"], name=f"{who}-admin")[1])
        for who in ("acme", "globex")
    }
    for who, headers in tenants.items():
        for i in range(3):
            appended = client.post(
                f"/api/v1/streams/{who}-order-{i}/events",
                json={"events": [{"type": "OrderPlaced", "data": {"i": i}}]},
                headers=headers,
            )
            assert appended.status_code == 201, appended.text
        started = client.post("/api/v1/workflows/linear/runs", json={"input": {"n": 2}}, headers=headers)
        assert started.status_code in (200, 201, 202), started.text
    wait_until(
        lambda: all(s["state"] == "running" for s in health(client, server).values()),
        timeout=60,
        what="both projections to catch up",
    )

    # The wrong administrator: a tenant's admin, on the tables every tenant reads. Nothing changes.
    runs_before = client.get("/api/v1/projections/workflow_tables/runs", headers=server).json()["runs"]
    for lever, body in (("replay", {"after": "0:0"}), ("rebuild", None), ("verify", None)):
        refused = client.post(
            f"/api/v1/projections/workflow_tables/{lever}", json=body, headers=tenants["acme"]
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "forbidden"
    assert (
        client.get("/api/v1/projections/workflow_tables/runs", headers=server).json()["runs"] == runs_before
    )

    # The server administrator, on every built-in: each one replays, then runs on and verifies equal.
    for projection in ("workflow_tables", "stream_catalogue"):
        replayed = client.post(
            f"/api/v1/projections/{projection}/replay", json={"after": "0:0"}, headers=server
        )
        assert replayed.status_code == 202, replayed.text
        accepted = replayed.json()
        expected_kind = "rebuild" if projection == "workflow_tables" else "replay"
        assert accepted["kind"] == expected_kind, accepted
        # No new append is made: an in-place replay must start (and end) on its own.
        assert ended(client, server, projection, accepted["run_id"])["status"] == "completed"

    after = client.post("/api/v1/workflows/linear/runs", json={"input": {"n": 1}}, headers=tenants["globex"])
    run_id = after.json()["run_id"]
    wait_until(
        lambda: (
            client.get(f"/api/v1/runs/{run_id}", headers=tenants["globex"]).json()["status"] == "succeeded"
        ),
        timeout=60,
        what="a run started after the replays to succeed",
    )
    wait_until(
        lambda: any(
            r["run_id"] == run_id
            for r in client.get("/api/v1/runs", headers=tenants["globex"]).json()["runs"]
        ),
        timeout=60,
        what="the run list to show it",
    )
    for projection in ("workflow_tables", "stream_catalogue"):
        assert health(client, server)[projection]["open_failures"] == 0
        verified = client.post(f"/api/v1/projections/{projection}/verify", headers=server)
        assert verified.status_code == 202, verified.text
        run = ended(client, server, projection, verified.json()["run_id"])
        assert run["status"] == "completed", run

    # A tenant's admin on a per-tenant projection: only its own rows, and only its own runs are listed.
    own = client.post("/api/v1/projections/stream_catalogue/verify", headers=tenants["acme"])
    assert own.status_code == 202, own.text
    assert ended(client, tenants["acme"], "stream_catalogue", own.json()["run_id"])["status"] == "completed"
    listed = client.get("/api/v1/projections/stream_catalogue/runs", headers=tenants["globex"]).json()["runs"]
    assert own.json()["run_id"] not in {r["id"] for r in listed}


def test_twenty_concurrent_verifies_never_share_a_scratch_schema(
    store: EventStore, served: httpx.Client
) -> None:
    client = served
    _, secret = create_token(store, tenant="default", scopes=["admin"], name="ops", server_admin=True)
    headers = bearer(secret)
    for i in range(200):
        client.post(
            f"/api/v1/streams/load-{i % 20}/events",
            json={"events": [{"type": "Loaded", "data": {"i": i}}]},
            headers=headers,
        )
    answers: list[httpx.Response] = []
    gate = threading.Barrier(20, timeout=60)

    def ask() -> None:
        gate.wait()
        answers.append(client.post("/api/v1/projections/stream_catalogue/verify", headers=headers))

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) <= {202, 409}, [a.text for a in answers]
    for refused in (a for a in answers if a.status_code == 409):
        assert refused.json()["error"]["code"] == "run_in_progress"
        assert isinstance(refused.json()["error"]["details"]["run_id"], int)
    for accepted in (a for a in answers if a.status_code == 202):
        run = ended(client, headers, "stream_catalogue", accepted.json()["run_id"])
        assert run["status"] == "completed", run
    with store.pool.connection() as conn:
        assert run_rows.scratch_schemas(conn) == []

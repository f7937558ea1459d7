"""Both kinds of administrator over HTTP, with two tenants.

A tenant's admin is refused (403, nothing changes) on the projections every tenant reads, and operates
only its own tenant's rows of per-tenant projections, its own failures and its own runs; a server
administrator operates everything. One rebuild, replay or verify per projection and scope at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from eventstore import Cursor, NewEvent
from ops.services import Services
from projector import Projection, ProjectorWorker, cursor_rows, failure_rows, run_rows
from projector.digest import projection_digest
from projector.registry import find
from tests.api.helpers import Headers, MakeToken
from tests.api.roles import server_admin, tenant_admin
from tests.waiting import wait_until

A, B = "tenant-a", "tenant-b"


@dataclass
class World:
    services: Services
    client: TestClient
    ops: Headers
    admin_a: Headers
    admin_b: Headers
    projector: ProjectorWorker

    def catch_up(self) -> None:
        self.projector.run_until_caught_up()

    def projection(self, name: str) -> Projection:
        return find(self.services.projections, name)

    def digest(self, name: str, tenant: str | None = None) -> str:
        projection = self.projection(name)
        with self.services.store.pool.connection() as conn:
            return projection_digest(conn, projection, projection.schema, tenant=tenant)

    def runs(self, name: str, headers: Headers) -> list[dict[str, Any]]:
        response = self.client.get(f"/api/v1/projections/{name}/runs?limit=500", headers=headers)
        assert response.status_code == 200, response.text
        runs: list[dict[str, Any]] = response.json()["runs"]
        return runs

    def finished(self, name: str, run_id: int) -> dict[str, Any]:
        """The run once it has ended (the projector carries in-place replays out, so keep it working)."""

        def ended() -> dict[str, Any] | None:
            self.catch_up()
            [run] = [r for r in self.runs(name, self.ops) if r["id"] == run_id]
            return run if run["status"] != "running" else None

        run = wait_until(ended, what=f"run {run_id} of {name} to end")
        assert run is not None
        return run

    def lever(self, name: str, action: str, headers: Headers, body: object = None) -> dict[str, Any]:
        """Pull a lever that must be accepted; return the run once it has ended."""
        response = self.client.post(f"/api/v1/projections/{name}/{action}", json=body, headers=headers)
        assert response.status_code == 202, response.text
        return self.finished(name, response.json()["run_id"])


@pytest.fixture
def world(client: TestClient, services: Services, make_token: MakeToken) -> Iterator[World]:
    """Two tenants, each with streams and workflow runs, every projection caught up."""
    for tenant in (A, B):
        producer = make_token("append", tenant=tenant)
        for i in range(3):
            services.store.append(
                f"order-{i}", [NewEvent("Placed", {"n": n}) for n in range(i + 1)], tenant=tenant
            )
            response = client.post(
                "/api/v1/workflows/linear/runs", json={"input": {"n": i}}, headers=producer
            )
            assert response.status_code == 201, response.text
    projector = ProjectorWorker(services.store, services.projections)
    world = World(
        services,
        client,
        server_admin(services),
        tenant_admin(services, A),
        tenant_admin(services, B),
        projector,
    )
    world.catch_up()
    try:
        yield world
    finally:
        projector.release_all()


def operator_runs(services: Services) -> list[tuple[int, str, str | None, str]]:
    with services.store.pool.connection() as conn:
        return [
            (r.id, r.kind, r.tenant, r.status)
            for r in run_rows.list_runs(conn, limit=1000)
            if r.kind != "catch_up"
        ]


def cursor_of(services: Services, name: str) -> Cursor:
    with services.store.pool.connection() as conn:
        current = cursor_rows.get_cursor(conn, name)
    assert current is not None
    return current.cursor


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("rebuild", None),
        ("verify", None),
        ("replay", {"after": "0:0"}),
        ("replay", {"since": "2000-01-01T00:00:00Z"}),
    ],
)
def test_a_tenant_admin_cannot_operate_a_shared_projection(
    world: World, action: str, body: dict[str, str] | None
) -> None:
    before = (world.digest("workflow_tables"), cursor_of(world.services, "workflow_tables"))
    runs_before = operator_runs(world.services)

    response = world.client.post(
        f"/api/v1/projections/workflow_tables/{action}", json=body, headers=world.admin_a
    )

    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "forbidden"
    assert error["details"]["required_any_of"] == ["server_admin"]
    assert "every tenant reads" in error["message"]
    assert "--server-admin" in error["message"]
    assert operator_runs(world.services) == runs_before  # no run was even recorded
    world.catch_up()
    assert (world.digest("workflow_tables"), cursor_of(world.services, "workflow_tables")) == before


def test_the_server_admin_replays_rebuilds_and_verifies_a_shared_projection(world: World) -> None:
    before = world.digest("workflow_tables")

    response = world.client.post(
        "/api/v1/projections/workflow_tables/replay", json={"after": "0:0"}, headers=world.ops
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    # workflow_tables cannot be replayed in place: it is rebuilt, and the answer says so.
    assert accepted["kind"] == "rebuild"
    assert "rebuilt" in accepted["note"]
    replayed = world.finished("workflow_tables", accepted["run_id"])
    assert (replayed["status"], replayed["tenant"], replayed["trigger"]) == ("completed", None, "replay")

    rebuilt = world.lever("workflow_tables", "rebuild", world.ops)
    assert rebuilt["status"] == "completed"
    verified = world.lever("workflow_tables", "verify", world.ops)
    assert (verified["status"], verified["error"]) == ("completed", None)  # the digests are equal
    assert world.digest("workflow_tables") == before

    # The projection runs on: a new run of a tenant is projected, and nothing has failed.
    producer = tenant_admin(world.services, B)
    assert world.client.post("/api/v1/workflows/linear/runs", json={}, headers=producer).status_code == 201
    world.catch_up()
    listed = world.client.get("/api/v1/runs", headers=producer).json()["runs"]
    assert len(listed) == 4
    assert world.client.get("/api/v1/failures?all=true", headers=world.ops).json() == {"failures": []}
    assert world.lever("workflow_tables", "verify", world.ops)["status"] == "completed"


def test_a_tenant_admin_replays_and_verifies_its_own_slice_of_stream_catalogue(world: World) -> None:
    # Damage one row of each tenant, so a run over the wrong rows would show.
    with psycopg.connect(world.services.settings.database_url, autocommit=True) as conn:
        for tenant in (A, B):
            conn.execute(
                "UPDATE ledgerflow.stream_catalogue SET version = 99 "
                "WHERE tenant = %s AND stream_id = 'order-0'",
                (tenant,),
            )
    damaged_b = world.digest("stream_catalogue", B)

    response = world.client.post(
        "/api/v1/projections/stream_catalogue/replay", json={"after": "0:0"}, headers=world.admin_a
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["kind"] == "rebuild"  # one tenant's rows are rebuilt, not replayed in place
    assert A in accepted["note"]
    run = world.finished("stream_catalogue", accepted["run_id"])
    assert (run["status"], run["tenant"]) == ("completed", A)

    # A's rows are repaired, B's are exactly as they were: the run touched tenant A's rows alone.
    assert world.digest("stream_catalogue", B) == damaged_b
    with psycopg.connect(world.services.settings.database_url) as conn:
        versions = dict(
            conn.execute(
                "SELECT tenant, version FROM ledgerflow.stream_catalogue WHERE stream_id = 'order-0'"
            ).fetchall()
        )
    assert versions == {A: 1, B: 99}

    verified = world.lever("stream_catalogue", "verify", world.admin_a)
    assert (verified["status"], verified["tenant"], verified["error"]) == ("completed", A, None)
    # B's admin finds its own slice damaged, and B's run is B's.
    failed = world.lever("stream_catalogue", "verify", world.admin_b)
    assert (failed["status"], failed["tenant"]) == ("failed", B)
    assert "digest mismatch" in failed["error"]
    assert world.lever("stream_catalogue", "rebuild", world.admin_b)["tenant"] == B
    assert world.lever("stream_catalogue", "verify", world.ops)["status"] == "completed"


def test_runs_listed_to_a_tenant_are_global_or_its_own(world: World) -> None:
    own_a = world.lever("stream_catalogue", "verify", world.admin_a)["id"]
    own_b = world.lever("stream_catalogue", "verify", world.admin_b)["id"]
    everyone = world.lever("stream_catalogue", "verify", world.ops)["id"]
    with world.services.store.pool.connection() as conn:  # a run over every tenant that failed
        failed_global = run_rows.start_run(
            conn, "stream_catalogue", "rebuild", trigger="test", actor="test", owner="x", start=Cursor()
        )
        run_rows.finish_run(conn, failed_global, "failed", error="boom in order-2 of tenant-b")

    seen_by_a = {r["id"]: r for r in world.runs("stream_catalogue", world.admin_a)}
    assert {own_a, everyone, failed_global} <= set(seen_by_a)
    assert own_b not in seen_by_a
    assert {r["tenant"] for r in seen_by_a.values()} == {None, A}
    assert "tenant-b" not in seen_by_a[failed_global]["error"]  # another tenant's data, hidden
    assert "server administrators" in seen_by_a[failed_global]["error"]

    seen_by_ops = {r["id"]: r for r in world.runs("stream_catalogue", world.ops)}
    assert {own_a, own_b, everyone, failed_global} <= set(seen_by_ops)
    assert seen_by_ops[failed_global]["error"] == "boom in order-2 of tenant-b"


def record_failure(services: Services, tenant: str, message: str) -> int:
    [event, *_] = services.store.read_stream("order-1", tenant=tenant)
    with services.store.pool.connection() as conn:
        return failure_rows.record_failure(conn, "stream_catalogue", event, "park", ValueError(message), 3)


def test_failures_are_scoped_to_their_tenant(world: World) -> None:
    fail_a = record_failure(world.services, A, "bad data of tenant-a")
    fail_b = record_failure(world.services, B, "secret data of tenant-b")

    def listed(headers: Headers, query: str = "") -> list[int]:
        response = world.client.get(f"/api/v1/failures{query}", headers=headers)
        assert response.status_code == 200, response.text
        return [f["id"] for f in response.json()["failures"]]

    assert listed(world.admin_a) == [fail_a]
    assert listed(world.admin_b) == [fail_b]
    assert listed(world.admin_a, "?all=true&projection=stream_catalogue") == [fail_a]
    assert listed(world.ops) == [fail_b, fail_a]
    assert "secret data" not in world.client.get("/api/v1/failures?all=true", headers=world.admin_a).text

    # Another tenant's failure is not found, and stays as it was.
    for action in ("retry", "skip"):
        response = world.client.post(f"/api/v1/failures/{fail_b}/{action}", headers=world.admin_a)
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "not_found"
    with world.services.store.pool.connection() as conn:
        failure = failure_rows.get_failure(conn, fail_b)
    assert failure is not None
    assert (failure.status, failure.resolved_by) == ("open", None)

    # Its own: retried and skipped; the server administrator's reach is every tenant's.
    assert world.client.post(f"/api/v1/failures/{fail_a}/retry", headers=world.admin_a).status_code == 200
    assert world.client.post(f"/api/v1/failures/{fail_a}/skip", headers=world.admin_a).status_code == 200
    assert world.client.post(f"/api/v1/failures/{fail_b}/skip", headers=world.ops).status_code == 200
    with world.services.store.pool.connection() as conn:
        statuses = {f.id: f.status for f in failure_rows.list_failures(conn, None, include_closed=True)}
    assert statuses == {fail_a: "skip_requested", fail_b: "skip_requested"}


def test_projection_health_counts_only_the_tenants_own_failures(world: World) -> None:
    record_failure(world.services, B, "b's")
    record_failure(world.services, B, "b's again")

    def open_failures(headers: Headers) -> int:
        body = world.client.get("/api/v1/projections", headers=headers).json()
        [catalogue] = [p for p in body["projections"] if p["name"] == "stream_catalogue"]
        return int(catalogue["open_failures"])

    assert (open_failures(world.admin_a), open_failures(world.admin_b), open_failures(world.ops)) == (0, 1, 1)


@pytest.mark.parametrize("who", ["server", "tenant"])
def test_concurrent_verifies_run_once_and_the_others_name_the_run(world: World, who: str) -> None:
    name, headers = ("workflow_tables", world.ops) if who == "server" else ("stream_catalogue", world.admin_a)
    start = threading.Barrier(20, timeout=60)

    def verify(_: int) -> tuple[int, dict[str, Any]]:
        start.wait()
        response = world.client.post(f"/api/v1/projections/{name}/verify", headers=headers)
        return response.status_code, response.json()

    # Holding the projection's cursor row keeps the accepted verify from finishing (its last step locks
    # that row), so every other request meets it running.
    with psycopg.connect(world.services.settings.database_url) as holder:
        holder.execute(
            "SELECT 1 FROM ledgerflow.projection_cursors WHERE projection = %s FOR UPDATE", (name,)
        )
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(verify, range(20)))
        holder.rollback()

    accepted = [body for status, body in answers if status == 202]
    refused = [body["error"] for status, body in answers if status == 409]
    assert len(accepted) == 1, answers
    assert len(refused) == 19, answers
    run_id = accepted[0]["run_id"]
    # Each refusal names the running verify.
    assert {(e["code"], e["details"]["run_id"], e["details"]["kind"]) for e in refused} == {
        ("run_in_progress", run_id, "verify")
    }
    run = world.finished(name, run_id)
    assert (run["status"], run["error"]) == ("completed", None)
    assert world.lever(name, "verify", headers)["status"] == "completed"  # the scope is free again

"""A tenant's admin rebuilds, replays and verifies its own rows of a partitioned per-tenant projection over
HTTP, as of an unpartitioned one: the runs are its tenant's, and the other tenant's rows are untouched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from eventstore import NewEvent
from ops.services import Services, open_services
from ops.settings import Settings
from projector import ProjectorWorker
from projector.digest import projection_digest
from tests.api.helpers import Headers
from tests.api.roles import tenant_admin
from tests.projections import tenant_partitioned_counter as counter
from tests.waiting import wait_until

A, B = "tenant-a", "tenant-b"
LEVERS = f"/api/v1/projections/{counter.name}"


@pytest.fixture
def services(database_url: str) -> Iterator[Services]:
    settings = Settings(
        database_url=database_url,
        workflows="tests.flows:registry",
        projections="tests.projections:tenant_partitioned_counter",
    )
    opened = open_services(settings)
    try:
        yield opened
    finally:
        opened.close()


def pull(client: TestClient, action: str, headers: Headers, body: object = None) -> dict[str, Any]:
    """Pull a lever that must be accepted; return the run once it has ended."""
    response = client.post(f"{LEVERS}/{action}", json=body, headers=headers)
    assert response.status_code == 202, response.text
    run_id = response.json()["run_id"]

    def ended() -> dict[str, Any] | None:
        runs = client.get(f"{LEVERS}/runs?limit=50", headers=headers).json()["runs"]
        [run] = [r for r in runs if r["id"] == run_id]
        return run if run["status"] != "running" else None

    run = wait_until(ended, what=f"run {run_id} to end")
    assert run is not None
    return run


def test_a_tenant_admin_operates_its_rows_of_a_partitioned_projection(
    client: TestClient, services: Services
) -> None:
    for tenant in (A, B):
        for i in range(4):
            services.store.append(f"order-{i}", [NewEvent("Placed", {})], tenant=tenant)
    projector = ProjectorWorker(services.store, [counter])
    projector.run_until_caught_up()
    with services.store.pool.connection() as conn:  # damage both tenants' rows
        conn.execute(f'UPDATE "{counter.schema}".counts SET n = 99 WHERE stream_id = %s', ("order-0",))
        damaged_b = projection_digest(conn, counter, counter.schema, tenant=B)
    admin_a, admin_b = tenant_admin(services, A), tenant_admin(services, B)

    failed = pull(client, "verify", admin_a)
    assert (failed["status"], failed["tenant"]) == ("failed", A)
    rebuilt = pull(client, "rebuild", admin_a)
    assert (rebuilt["status"], rebuilt["tenant"]) == ("completed", A)
    assert pull(client, "verify", admin_a)["status"] == "completed"
    replayed = pull(client, "replay", admin_a, {"after": "0:0"})
    assert (replayed["kind"], replayed["status"], replayed["tenant"]) == ("rebuild", "completed", A)
    with services.store.pool.connection() as conn:
        assert projection_digest(conn, counter, counter.schema, tenant=B) == damaged_b  # B's untouched
    assert pull(client, "verify", admin_b)["status"] == "failed"
    projector.release_all()

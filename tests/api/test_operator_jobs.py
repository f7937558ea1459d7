"""Operator jobs over HTTP are queued per tenant: a tenant whose job is slow holds up its own queue only,
and a tenant's full queue is answered 429 with Retry-After, the error shape, and nothing recorded."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from eventstore import NewEvent
from ops.api import create_app
from ops.api.jobs import BackgroundJobs
from ops.api.settings import ApiSettings
from ops.services import Services
from projector import ProjectorWorker, run_rows
from tests.api.roles import tenant_admin
from tests.waiting import wait_until

A, B = "tenant-a", "tenant-b"
WAIT = 30.0
REBUILD = "/api/v1/projections/stream_catalogue/rebuild"


def operator_runs(services: Services, tenant: str) -> list[tuple[int, str]]:
    with services.store.pool.connection() as conn:
        runs = run_rows.list_runs(conn, limit=1000)
    return [(r.id, r.status) for r in runs if r.kind != "catch_up" and r.tenant == tenant]


@pytest.fixture
def client(services: Services) -> Iterator[TestClient]:
    app = create_app(services, settings=ApiSettings(api_job_threads=2, api_max_queued_jobs=1))
    with TestClient(app) as c:
        yield c


def test_a_tenant_with_a_slow_job_holds_up_its_own_queue_only(client: TestClient, services: Services) -> None:
    for tenant in (A, B):
        services.store.append("order-1", [NewEvent("Placed", {})], tenant=tenant)
    projector = ProjectorWorker(services.store, services.projections)
    projector.run_until_caught_up()
    jobs = client.app.state.jobs  # type: ignore[attr-defined]
    assert isinstance(jobs, BackgroundJobs)
    gate, started = threading.Event(), threading.Event()

    def slow() -> None:  # tenant A's slow job, and then one waiting in A's queue
        started.set()
        assert gate.wait(WAIT)

    try:
        jobs.submit("slow", slow, lane=A)
        assert started.wait(WAIT)
        jobs.submit("waiting", lambda: None, lane=A)
        before = operator_runs(services, A)

        refused = client.post(
            "/api/v1/projections/stream_catalogue/rebuild", headers=tenant_admin(services, A)
        )
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"].isdigit()
        error = refused.json()["error"]
        assert error["code"] == "job_queue_full"
        assert error["details"]["queued"] == 1
        assert error["next"]
        assert operator_runs(services, A) == before  # nothing recorded

        # Tenant B's rebuild starts and completes while A's job still runs.
        accepted = client.post(
            "/api/v1/projections/stream_catalogue/rebuild", headers=tenant_admin(services, B)
        )
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]

        wait_until(
            lambda: (run_id, "completed") in operator_runs(services, B),
            timeout=WAIT,
            what="tenant B's rebuild, while tenant A's slow job runs",
        )
        assert not gate.is_set()
    finally:
        gate.set()
        projector.release_all()

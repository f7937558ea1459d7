"""Probes, the error shape and its status mapping, the OpenAPI document, request ids and logs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from structlog.testing import capture_logs

from eventstore.errors import (
    ConflictError,
    DatabaseUnavailableError,
    DuplicateEventIdError,
    EventTooLargeError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    MigrationError,
    NotFoundError,
    WrongExpectedVersionError,
)
from ops.api import create_app
from ops.api.errors import status_of
from ops.api.settings import ApiSettings
from ops.auth import AuthenticationError, PermissionDeniedError
from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers, MakeToken, event_count, events_body
from tests.waiting import wait_until
from workflows import DefinitionError, RunStateError, WorkerSettings, WorkflowWorker


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (WrongExpectedVersionError("t", "s", "version 1", 2), 409),
        (IdempotencyConflictError("t", "k"), 409),
        (DuplicateEventIdError("event id taken"), 409),
        (ConflictError("busy"), 409),
        (RunStateError("done"), 409),
        (InvalidInputError("bad"), 422),
        (EventTooLargeError("big"), 422),
        (DefinitionError("bad flow"), 422),
        (NotFoundError("gone"), 404),
        (AuthenticationError("who"), 401),
        (PermissionDeniedError("no", required=["admin"], granted=["read"]), 403),
        (DatabaseUnavailableError("down"), 503),
        (MigrationError("pending"), 503),
        (LedgerflowError("unexpected"), 500),
    ],
)
def test_every_typed_error_has_its_status(error: LedgerflowError, status: int) -> None:
    assert status_of(error) == status


def test_healthz_answers_without_a_token(client: TestClient) -> None:
    response = client.get("/api/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok", "reason": None})


@pytest.fixture
def broken(services: Services) -> Iterator[TestClient]:
    """A client whose database has gone away (the pool is closed: every checkout fails at once)."""
    with TestClient(create_app(services)) as c:
        services.store.pool.close()
        yield c


def test_healthz_is_503_when_the_database_does_not_answer(broken: TestClient) -> None:
    response = broken.get("/api/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert response.json()["reason"]
    ready = broken.get("/api/readyz")
    assert (ready.status_code, ready.json()["status"]) == (503, "unavailable")


def test_a_lost_database_is_503_with_retry_after(broken: TestClient) -> None:
    headers = {"Authorization": "Bearer lf_0123456789abcdef_" + "x" * 43}
    response = broken.post("/api/v1/streams/order-1/events", json=events_body(), headers=headers)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"
    assert response.headers["Retry-After"] == "1"


def test_readyz_is_200_when_migrations_are_applied(client: TestClient) -> None:
    body = client.get("/api/readyz").json()
    assert body["status"] == "ready"
    shipped = sorted(
        int(f.name[:4]) for f in (Path(__file__).parents[2] / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql")
    )
    assert body["migrations"]["applied"] == shipped
    assert body["migrations"]["pending"] == []
    assert body["projectors"] == {"active": False, "projections_with_live_owner": []}
    assert body["workers"] == {"active": False, "live": 0}


def test_readyz_is_503_while_migrations_are_pending(client: TestClient, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM ledgerflow.schema_migrations WHERE version = 4")
    # readyz answers from the server's background check: the next one sees the change.
    response = wait_until(
        lambda: (r := client.get("/api/readyz")).status_code == 503 and r, what="readyz to see it"
    )
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready"
    assert body["migrations"]["pending"] == [{"version": 4, "name": "api_tokens"}]


def test_probes_answer_at_once_while_the_pool_is_held(client: TestClient, services: Services) -> None:
    """One tenant's slow requests may hold every pool connection; the probes answer from the server's
    background check all the same. Before, readyz waited LEDGERFLOW_PROBE_TIMEOUT (2 s) for a pool
    connection, then answered 503."""
    pool = services.store.pool
    held = [pool.getconn() for _ in range(pool.max_size)]
    try:
        _probes_answer_at_once(client, 10)
        assert client.get("/api/readyz").json()["status"] == "ready"
    finally:
        for conn in held:
            pool.putconn(conn)


def test_probes_answer_at_once_while_another_tenants_requests_hold_the_pool(
    services: Services, make_token: MakeToken, database_url: str
) -> None:
    """A tenant allowed as many requests in flight as the pool has connections holds every one of them
    (its appends wait on a lock meanwhile); readyz and healthz answer all the same. Before, readyz waited
    LEDGERFLOW_PROBE_TIMEOUT (2 s) for a pool connection, then answered 503."""
    pool = services.store.pool
    acme = make_token("admin", tenant="acme")
    settings = ApiSettings(max_requests_per_tenant=pool.max_size + 2)
    with (
        TestClient(create_app(services, settings=settings)) as client,
        psycopg.connect(database_url) as locker,
        ThreadPoolExecutor(pool.max_size) as senders,
    ):
        assert client.get("/api/v1/runs", headers=acme).status_code == 200  # warms the token lookup
        locker.execute("LOCK TABLE ledgerflow.events IN ACCESS EXCLUSIVE MODE")
        appends = [
            senders.submit(client.post, f"/api/v1/streams/s-{i}/events", json=events_body(), headers=acme)
            for i in range(pool.max_size)
        ]
        try:
            wait_until(lambda: _waiting_on_locks(database_url) >= pool.max_size, what="the pool to be held")
            _probes_answer_at_once(client, 5)
        finally:
            locker.rollback()
        assert [a.result(timeout=60).status_code for a in appends] == [201] * pool.max_size


def _probes_answer_at_once(client: TestClient, rounds: int) -> None:
    """readyz and healthz answer 200, readyz in a median under 1 s: generous (it reads nothing), and half
    of what waiting for a pool connection took before (LEDGERFLOW_PROBE_TIMEOUT, then 503)."""
    took: list[float] = []
    for _ in range(rounds):
        began = time.monotonic()
        ready = client.get("/api/readyz")
        took.append(time.monotonic() - began)
        assert ready.status_code == 200, ready.text
        assert client.get("/api/healthz").status_code == 200
    assert sorted(took)[len(took) // 2] < 1.0, took


def _waiting_on_locks(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_readyz_sees_projectors_and_workflow_workers(client: TestClient, services: Services) -> None:
    projector = ProjectorWorker(services.store, services.projections)
    projector.run_until_caught_up()  # holds the leases until released
    worker = WorkflowWorker(
        services.engine,
        services.registry,
        WorkerSettings(poll_interval=0.1, shutdown_grace=1),
        name="ready-w",
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        body = wait_until(
            lambda: (b := client.get("/api/readyz").json())["workers"]["active"] and b,
            what="the worker to be seen",
        )
        assert body["workers"]["live"] == 1
        assert body["projectors"]["active"] is True
        assert set(body["projectors"]["projections_with_live_owner"]) == {
            "stream_catalogue",
            "workflow_tables",
        }
    finally:
        worker.stop()
        thread.join(timeout=15)
        projector.release_all()


def test_unknown_routes_and_methods_use_the_error_shape(client: TestClient, admin: Headers) -> None:
    missing = client.get("/api/v1/nothing", headers=admin)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = client.delete("/api/v1/runs", headers=admin)
    assert wrong.status_code == 405
    assert set(wrong.json()["error"]) == {"code", "message", "next", "details"}


def test_validation_errors_name_the_fields_without_echoing_input(
    client: TestClient, admin: Headers, database_url: str
) -> None:
    marker = "s3cr3t-value"
    response = client.post(
        "/api/v1/streams/order-1/events", json={"events": [{"type": marker, "data": 1}]}, headers=admin
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert ["body", "events", "0", "data"] in [e["loc"] for e in error["details"]["errors"]]
    assert marker not in response.text
    assert event_count(database_url) == 0


def test_openapi_and_docs_are_published(client: TestClient) -> None:
    schema = client.get("/api/openapi.json").json()
    paths = schema["paths"]
    assert "/api/v1/streams/{stream_id}/events" in paths
    assert "/api/v1/runs/{run_id}" in paths
    assert "/api/healthz" in paths
    post = paths["/api/v1/streams/{stream_id}/events"]["post"]
    assert {"201", "401", "403", "409", "413", "422", "503"} <= set(post["responses"])
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert client.get("/api/docs").status_code == 200


def test_a_request_id_is_returned_and_logged(client: TestClient) -> None:
    with capture_logs() as logs:
        response = client.get("/api/v1/runs", headers={"X-Request-ID": "abc-123"})
    assert response.headers["X-Request-ID"] == "abc-123"
    assert response.status_code == 401
    [failed] = [e for e in logs if e["event"] == "api_authentication_failed"]
    assert failed["log_level"] == "info"
    assert client.get("/api/healthz", headers={"X-Request-ID": "bad id"}).headers["X-Request-ID"] != "bad id"


def test_an_app_serves_again_after_its_lifespan_ended(app: FastAPI) -> None:
    """A lifespan may run more than once for one app (a test client entered again, as the fuzzing does):
    each start of its background threads (health checks, the bulk-action resumer) starts afresh."""
    for _ in range(2):
        with TestClient(app) as client:
            assert client.get("/api/healthz").status_code == 200

"""Limits over HTTP (`GET /api/v1/limits`, scope read) and as the metrics the API's process reports."""

from __future__ import annotations

from fastapi.testclient import TestClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ops.services import Services
from tests.api.helpers import MakeToken
from tests.integration.test_telemetry import metric_points, telemetry
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry, queue_claims
from workflows.limits import declare

__all__ = ["telemetry"]  # the fixture, shared with the telemetry tests (one global meter provider)


def limited_engine(services: Services) -> Engine:
    registry = WorkflowRegistry()
    registry.limit("llm", concurrency=1, per_minute=30)
    wf = Workflow("summarise_limited")

    @wf.node(limits=["llm"])
    def call(ctx: NodeContext) -> int:
        return 1

    registry.register(wf)
    with services.store.pool.connection() as conn:
        declare(conn, registry, worker="api/1")
    return Engine(services.store, registry)


def saturate(services: Services) -> None:
    """Three runs of a node under a limit of one: one claimed, two waiting."""
    engine = limited_engine(services)
    for n in range(3):
        engine.start("summarise_limited", input={"n": n}, tenant="acme")
    with services.store.pool.connection() as conn:
        got = queue_claims.claim(
            conn, worker_name="w", instance="i", workflows=[("summarise_limited", "1")], limit=3, ttl=30
        )
    assert len(got) == 1


def test_limits_show_slots_in_use_and_nodes_waiting(
    client: TestClient, services: Services, make_token: MakeToken
) -> None:
    saturate(services)
    response = client.get("/api/v1/limits", headers=make_token("read"))
    assert response.status_code == 200, response.text
    (llm,) = response.json()["limits"]
    assert {k: llm[k] for k in ("name", "concurrency", "per_minute", "in_use", "waiting")} == {
        "name": "llm",
        "concurrency": 1,
        "per_minute": 30,
        "in_use": 1,
        "waiting": 2,
    }
    assert llm["started_last_minute"] == 1
    assert llm["declared_by"] == "api/1"


def test_limits_need_a_token_with_read(client: TestClient, make_token: MakeToken) -> None:
    assert client.get("/api/v1/limits").status_code == 401
    refused = client.get("/api/v1/limits", headers=make_token("append"))
    assert refused.status_code == 403
    assert refused.headers["content-type"].startswith("application/json")


def test_the_api_process_reports_the_limits_as_gauges(
    client: TestClient,
    services: Services,
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    _, reader = telemetry
    saturate(services)
    points = metric_points(reader)
    in_use = {p.attributes["limit"]: p.value for p in points["ledgerflow.workflow.limit_in_use"]}
    waiting = {p.attributes["limit"]: p.value for p in points["ledgerflow.workflow.limit_waiting"]}
    assert (in_use, waiting) == ({"llm": 1}, {"llm": 2})

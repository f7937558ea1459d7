"""Traces and metrics: the spans and instruments operators rely on are emitted with their attributes."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventstore import EventStore, NewEvent
from projector import ProjectorWorker, stream_catalogue
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker
from workflows.recovery import sweep

_SPANS = InMemorySpanExporter()
_READER = InMemoryMetricReader()
_installed = False


@pytest.fixture
def telemetry() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """In-memory exporters on the global providers (which can be set once per process)."""
    global _installed
    if not _installed:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_SPANS))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
        _installed = True
    _SPANS.clear()
    return _SPANS, _READER


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_appends_and_projection_batches_are_traced_and_counted(
    store: EventStore, telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    spans, reader = telemetry
    store.append("order-1", [NewEvent("Placed", {}), NewEvent("Paid", {})], tenant="acme")
    ProjectorWorker(store, [stream_catalogue]).run_until_caught_up()
    (append,) = [s for s in spans.get_finished_spans() if s.name == "ledgerflow.append"]
    assert append.attributes is not None
    assert append.attributes["ledgerflow.tenant"] == "acme"
    assert append.attributes["ledgerflow.events"] == 2
    batches = [s for s in spans.get_finished_spans() if s.name == "ledgerflow.projection.batch"]
    assert any(s.attributes and s.attributes["ledgerflow.projection"] == "stream_catalogue" for s in batches)
    points = metric_points(reader)
    assert sum(p.value for p in points["ledgerflow.events.appended"] if p.attributes["tenant"] == "acme") >= 2
    assert any(p.count >= 1 for p in points["ledgerflow.append.duration"])
    assert (
        sum(
            p.value
            for p in points["ledgerflow.events.projected"]
            if p.attributes["projection"] == "stream_catalogue"
        )
        >= 2
    )


def test_nodes_and_recovery_are_traced_and_counted(
    store: EventStore, telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    spans, reader = telemetry
    engine = Engine(store, registry)
    run_id = engine.start("linear").run_id
    worker = WorkflowWorker(engine, registry, WorkerSettings(poll_interval=0.05), name="telemetry")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: not engine.load(run_id).active, what="the run to finish")
    finally:
        worker.stop()
        thread.join(timeout=15)
    nodes = [s for s in spans.get_finished_spans() if s.name == "ledgerflow.node"]
    assert sorted(s.attributes["ledgerflow.node"] for s in nodes if s.attributes) == [
        "first",
        "second",
        "third",
    ]
    assert all(s.attributes and s.attributes["ledgerflow.outcome"] == "succeeded" for s in nodes)

    # A lapsed lease, reclaimed by a recovery sweep.
    engine.start("linear")
    assert len(worker._claim(1)) == 1
    with store.pool.connection() as conn:
        conn.execute("UPDATE ledgerflow.workflow_queue SET lease_expires_at = clock_timestamp()")
    report = sweep(engine, registry, worker_name="recoverer", instance="r1")
    assert report.reclaimed == 1
    (recovery,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "ledgerflow.recovery" and s.attributes and s.attributes["ledgerflow.reclaimed"] == 1
    ]
    points = metric_points(reader)
    assert sum(p.value for p in points["ledgerflow.workflow.leases_reclaimed"]) >= 1
    assert sum(p.value for p in points["ledgerflow.workflow.nodes_claimed"]) >= 4
    assert sum(p.count for p in points["ledgerflow.workflow.node_duration"]) >= 3
    assert recovery.attributes is not None

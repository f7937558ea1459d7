"""An append builds no span while nobody receives spans, and traces as before once someone does."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventstore import EventStore, NewEvent, telemetry


class RefusingTracer:
    """Stands in for the tracer: any span started through it fails the append."""

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a span was started although nobody receives spans")


@pytest.mark.parametrize(
    "provider",
    [trace.ProxyTracerProvider(), trace.NoOpTracerProvider(), TracerProvider()],
    ids=["no provider installed", "no-op provider", "SDK provider without a span processor"],
)
def test_no_span_is_built_while_nobody_receives_spans(
    store: EventStore, monkeypatch: pytest.MonkeyPatch, provider: trace.TracerProvider
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(telemetry, "tracer", RefusingTracer())
    assert not telemetry.tracing()
    store.append("s", [NewEvent("Happened", {})])
    store.append("s", [NewEvent("Happened", {}), NewEvent("Happened", {})], idempotency_key="k")
    assert store.stream_version("s") == 3


def test_a_provider_with_a_span_processor_gets_the_append_span(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(telemetry, "tracer", provider.get_tracer("ledgerflow.eventstore"))
    assert telemetry.tracing()
    store.append("s", [NewEvent("Happened", {})], tenant="acme")
    (span,) = spans.get_finished_spans()
    assert span.name == "ledgerflow.append"
    assert span.attributes is not None
    assert span.attributes["ledgerflow.tenant"] == "acme"
    assert span.attributes["ledgerflow.events"] == 1


def test_hot_path_spans_of_nodes_and_batches_are_built_only_when_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node and projection-batch spans (`span_if_traced`) build neither span nor attributes while
    nobody receives spans, and are real spans once someone does."""

    def attributes() -> dict[str, Any]:
        raise AssertionError("attributes were built although nobody receives spans")

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: TracerProvider())
    with telemetry.span_if_traced(RefusingTracer(), "ledgerflow.node", attributes) as span:  # type: ignore[arg-type]
        assert span is trace.INVALID_SPAN
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    with telemetry.span_if_traced(provider.get_tracer("t"), "ledgerflow.node", lambda: {"a": 1}) as span:
        assert span.is_recording()
    assert [(s.name, dict(s.attributes or {})) for s in exporter.get_finished_spans()] == [
        ("ledgerflow.node", {"a": 1})
    ]

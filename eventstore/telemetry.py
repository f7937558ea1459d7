"""The event store's traces and metrics, through the OpenTelemetry API.

Instruments come from the global providers, which `ops.telemetry` configures; without a configured SDK
they are no-ops that cost about a microsecond. Spans on the hot path are only started when `tracing()`
says someone receives them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

tracer = trace.get_tracer("ledgerflow.eventstore")
_meter = metrics.get_meter("ledgerflow.eventstore")

events_appended = _meter.create_counter(
    "ledgerflow.events.appended", description="Events appended to the log"
)
append_latency = _meter.create_histogram(
    "ledgerflow.append.duration", unit="ms", description="Time to append a batch, from call to commit"
)
append_conflicts = _meter.create_counter(
    "ledgerflow.append.conflicts", description="Appends refused for a version or idempotency conflict"
)

_SILENT_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def tracing() -> bool:
    """Whether a span started now would go anywhere.

    Not while no tracer provider is installed (the API's proxy hands out non-recording spans), and not
    while the SDK's provider has no span processor (it would record spans that nobody exports): then an
    append skips building its span and attributes altogether. Asked on every call, so a provider or
    processor installed later is used at once.
    """
    provider = trace.get_tracer_provider()
    if isinstance(provider, _SILENT_PROVIDERS):
        return False
    # The SDK keeps its processors here; a provider of another kind is assumed to record.
    processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None)
    return processors != ()


def span_if_traced(
    tracer: trace.Tracer, name: str, attributes: Callable[[], Mapping[str, AttributeValue]]
) -> AbstractContextManager[trace.Span]:
    """`tracer.start_as_current_span(name, attributes=attributes())` when `tracing()`; otherwise a span
    that records nothing, without building it or its attributes (a hot path's spans: an SDK span costs
    tens of microseconds even when no processor receives it)."""
    if not tracing():
        return nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(name, attributes=attributes())

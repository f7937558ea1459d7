"""The event store's traces and metrics, through the OpenTelemetry API.

Instruments come from the global providers, which `ops.telemetry` configures; without a configured SDK
they are no-ops that cost about a microsecond.
"""

from __future__ import annotations

from opentelemetry import metrics, trace

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

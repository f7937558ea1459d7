"""Logging, traces and metrics, configured once by the entry points.

Logs: structlog, JSON lines when the output is not a terminal, readable lines when it is; context (run,
node, projection ids) is bound with contextvars. Traces and metrics: OpenTelemetry, exported through
OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, otherwise metrics are kept for the Prometheus-style
`/metrics` endpoint of the API and traces can go to the console (`LEDGERFLOW_TRACES=console`).
Library code only asks for loggers, tracers and meters.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import structlog
from opentelemetry import metrics, trace

LogFormat = Literal["auto", "json", "console"]
_telemetry_configured = False


def configure_logging(level: str = "info", fmt: LogFormat = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    _route_standard_logging(level, shared, renderer)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Not cached: the demo lowers the level after start-up, and loggers must follow.
    )


def _route_standard_logging(
    level: str, shared: list[structlog.types.Processor], renderer: structlog.types.Processor
) -> None:
    """Render the records of libraries that log through `logging` (the driver's pool, uvicorn) like our
    own, so that a process writes one format to stderr."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared, structlog.processors.format_exc_info],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    # The pool warns at every failed connection attempt; an outage is reported once, by
    # eventstore.outage, and a failure to start by the CLI: keep only the pool's errors.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    # The embedded server's package narrates every command it runs; ledgerflow logs the start itself.
    logging.getLogger("pgserver").setLevel(logging.WARNING)


def configure_telemetry(service: str = "ledgerflow") -> None:
    """Install the OpenTelemetry SDK providers once per process (servers and workers call this)."""
    global _telemetry_configured
    if _telemetry_configured:
        return
    _telemetry_configured = True
    # The SDK is imported here, by the one role that installs it: every other command (each CLI call, each
    # worker) starts without loading it.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = []
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    else:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        # Registers with prometheus_client's default registry, which the API serves at /metrics.
        readers.append(PrometheusMetricReader())
        if os.environ.get("LEDGERFLOW_TRACES") == "console":
            tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))

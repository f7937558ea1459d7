"""The Prometheus-style `/metrics` endpoint, fed by OpenTelemetry's Prometheus reader."""

from __future__ import annotations

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def add_metrics_route(app: FastAPI) -> None:
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)

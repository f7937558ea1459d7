"""The Prometheus-style `/metrics` endpoint, fed by OpenTelemetry's Prometheus reader.

Its series carry tenant names (e.g. append latency per tenant), so it answers only a server
administrator's token: a scraper sends one as `Authorization: Bearer <token>`.
"""

from __future__ import annotations

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ops.api.deps import ServerAdmin


def add_metrics_route(app: FastAPI) -> None:
    def metrics(principal: ServerAdmin) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)

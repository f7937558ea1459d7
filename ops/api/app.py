"""The HTTP API: `create_app(services)` gives the ASGI application.

Versioned routes live under `/api/v1`; the probes `/api/healthz` and `/api/readyz` and the OpenAPI
document `/api/openapi.json` (browsable at `/api/docs`) sit beside them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import APIRouter, FastAPI

from ops.api import errors, events, failures, health, projections, recovery, runs, workflows
from ops.api.errors import COMMON_RESPONSES
from ops.api.jobs import BackgroundJobs
from ops.api.middleware import BodyLimitMiddleware, RequestContextMiddleware
from ops.api.settings import ApiSettings
from ops.console import mount_console
from ops.services import Services

log = structlog.get_logger(__name__)

API_VERSION = "v1"


def create_app(services: Services, *, settings: ApiSettings | None = None) -> FastAPI:
    """The API over `services`. The caller owns `services` (and closes them); the app owns its job
    threads and waits for running jobs when it shuts down."""
    settings = settings or ApiSettings()
    jobs = BackgroundJobs()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info(
            "api_started", workflows=services.registry.names(), max_request_bytes=settings.max_request_bytes
        )
        try:
            yield
        finally:
            jobs.shutdown()
            log.info("api_stopped")

    app = FastAPI(
        title="ledgerflow",
        version=API_VERSION,
        description="Append and read events, start and steer workflow runs, operate projections.",
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.services = services
    app.state.api_settings = settings
    app.state.jobs = jobs
    errors.install(app)
    # Outermost first: the request id is bound before the size check, so a 413 is logged with it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestContextMiddleware)

    v1 = APIRouter(prefix=f"/api/{API_VERSION}", responses=COMMON_RESPONSES)
    for module in (events, workflows, runs, projections, failures, recovery):
        v1.include_router(module.router)
    app.include_router(v1)
    app.include_router(health.router, prefix="/api")
    mount_console(app)
    return app

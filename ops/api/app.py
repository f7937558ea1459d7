"""The HTTP API: `create_app(services)` gives the ASGI application.

Versioned routes live under `/api/v1`; the probes `/api/healthz` and `/api/readyz` and the OpenAPI
document `/api/openapi.json` (browsable at `/api/docs`) sit beside them. The document names the bearer
security scheme and, for each operation, the scope it requires (`x-required-scope`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

from ops.api import (
    bulk,
    errors,
    events,
    failures,
    health,
    limits,
    projections,
    recovery,
    run_search,
    run_waits,
    runs,
    subjects,
    workflows,
)
from ops.api.authn import AuthenticateFirstMiddleware
from ops.api.bulk_resume import BulkResumer
from ops.api.deps import SECURITY_SCHEME
from ops.api.docs import mount_docs
from ops.api.errors import COMMON_RESPONSES
from ops.api.guard import RequestGuardMiddleware
from ops.api.in_flight import RequestsInFlight
from ops.api.jobs import BackgroundJobs
from ops.api.middleware import BodyLimitMiddleware, RequestContextMiddleware, SecurityHeadersMiddleware
from ops.api.probes import DatabaseMonitor
from ops.api.settings import ApiSettings
from ops.api.token_lookups import TokenLookups
from ops.console import mount_console
from ops.services import Services
from projector import ProjectionWaiters

log = structlog.get_logger(__name__)

API_VERSION = "v1"


def create_app(services: Services, *, settings: ApiSettings | None = None) -> FastAPI:
    """The API over `services`. The caller owns `services` (and closes them); the app owns its job
    threads and waits for running jobs when it shuts down."""
    settings = settings or ApiSettings()
    jobs = BackgroundJobs(settings.api_job_threads, settings.api_max_queued_jobs)
    resumer = BulkResumer(services, jobs)  # bulk actions whose process was killed
    waiters = ProjectionWaiters(
        services.store,
        max_waiters=settings.max_projection_waiters,
        max_waiters_per_tenant=settings.max_projection_waiters_per_tenant,
        name="ledgerflow-api-listener",
    )
    tokens = TokenLookups(services.store, ttl=settings.token_cache_seconds, size=settings.token_cache_size)
    in_flight = RequestsInFlight(
        settings.max_requests_per_tenant,
        max_queued=settings.max_queued_requests_per_tenant,
        max_wait=settings.request_queue_seconds,
    )
    monitor = DatabaseMonitor(
        services.store.url,
        interval=settings.health_check_interval,
        timeout=settings.probe_timeout,
        projections=[p.name for p in services.projections],
        recent_seconds=health.recent_workers(services),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info(
            "api_started", workflows=services.registry.names(), max_request_bytes=settings.max_request_bytes
        )
        waiters.start()
        tokens.start()
        monitor.start()
        resumer.start()
        # The first probe answers from a check, not from "not checked yet".
        await asyncio.to_thread(monitor.wait_checked, settings.probe_timeout + 1)
        try:
            with limits.limit_metrics(services):
                yield
        finally:
            await waiters.stop()
            await tokens.stop()
            await asyncio.to_thread(monitor.stop)
            await asyncio.to_thread(resumer.stop)
            jobs.shutdown()
            log.info("api_stopped")

    app = FastAPI(
        title="ledgerflow",
        version=API_VERSION,
        description="Append and read events, start and steer workflow runs, operate projections.\n\n"
        "Every operation under /api/v1 needs a bearer token; `x-required-scope` names the scopes any one "
        "of which it needs (`admin` holds every scope). `server_admin` is a server administrator's "
        "token (`ledgerflow tokens create --server-admin`).",
        openapi_url="/api/openapi.json",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.services = services
    app.state.api_settings = settings
    app.state.jobs = jobs
    app.state.waiters = waiters
    app.state.monitor = monitor
    app.state.tokens = tokens
    app.state.in_flight = in_flight
    errors.install(app)
    # The last added runs first: the request id is bound before the size check, so a 413 is logged with
    # it, and the security headers go on every answer, the 413 included. The token is checked before the
    # body is read (counted, buffered, checked for UTF-8) or parsed.
    app.add_middleware(RequestGuardMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(AuthenticateFirstMiddleware, tokens=tokens, in_flight=in_flight)
    app.add_middleware(RequestContextMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)

    app.router.routes.extend(_routes())
    mount_docs(app)
    mount_console(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            name_required_scopes(schema)
        return app.openapi_schema  # type: ignore[return-value]  # set by FastAPI.openapi above

    app.openapi = openapi  # type: ignore[method-assign]
    return app


@functools.cache
def _routes() -> tuple[BaseRoute, ...]:
    """The API's routes, built once per process and shared by every app made in it: building them (each
    route's dependencies and response models analysed, then copied by each `include_router`) cost more
    than the rest of `create_app`, paid again for each app a process made. A route holds nothing of its
    app: its handlers find the app's services through the request (`ops.api.deps`)."""
    v1 = APIRouter(prefix=f"/api/{API_VERSION}", responses=COMMON_RESPONSES)
    # bulk before runs: /runs/bulk/cancel is a bulk action, not the cancel of a run whose id is `bulk`.
    for module in (
        events,
        workflows,
        run_search,
        bulk,
        runs,
        run_waits,
        projections,
        failures,
        recovery,
        limits,
        subjects,
    ):
        v1.include_router(module.router)
    routes = APIRouter()
    routes.include_router(v1)
    routes.include_router(health.router, prefix="/api")
    return tuple(routes.routes)


def name_required_scopes(schema: dict[str, Any]) -> None:
    """Each guarded operation's security requirement lists the scopes its guard declared; any one of them
    suffices, so it becomes one requirement per scope, `x-required-scope` names them, and a sentence in the
    description says so."""
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            scopes = [s for r in operation.get("security", []) for s in r.get(SECURITY_SCHEME, [])]
            if not scopes:
                continue
            operation["security"] = [{SECURITY_SCHEME: [s]} for s in scopes]
            operation.setdefault("x-required-scope", scopes)
            needs = " or ".join(f"`{s}`" for s in operation["x-required-scope"])
            sentence = operation.pop("x-required-scope-note", None) or f"Requires a token with scope {needs}."
            description = operation.get("description", "")
            operation["description"] = f"{description}\n\n{sentence}".strip()

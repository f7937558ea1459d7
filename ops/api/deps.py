"""Request dependencies: the shared services, and who is calling with which scopes.

Routes declare what they need as a type, e.g. `principal: Reader`; a request without a live bearer token
is refused with 401 before the route runs, one without the scope with 403.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import structlog
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from ops.api.jobs import BackgroundJobs
from ops.api.settings import ApiSettings
from ops.auth import AuthenticationError, Principal, authenticate
from ops.services import Services

log = structlog.get_logger(__name__)

_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="lf_<id>_<secret>",
    description="An API token created with `ledgerflow tokens create`.",
)


def get_services(request: Request) -> Services:
    services = request.app.state.services
    assert isinstance(services, Services)
    return services


def get_api_settings(request: Request) -> ApiSettings:
    settings = request.app.state.api_settings
    assert isinstance(settings, ApiSettings)
    return settings


def get_jobs(request: Request) -> BackgroundJobs:
    jobs = request.app.state.jobs
    assert isinstance(jobs, BackgroundJobs)
    return jobs


ServicesDep = Annotated[Services, Depends(get_services)]
ApiSettingsDep = Annotated[ApiSettings, Depends(get_api_settings)]
JobsDep = Annotated[BackgroundJobs, Depends(get_jobs)]


async def current_principal(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    try:
        if credentials is None:
            raise AuthenticationError("this request needs an API token: send 'Authorization: Bearer <token>'")
        principal = await run_in_threadpool(authenticate, services.store, credentials.credentials)
    except AuthenticationError as exc:
        log.info("api_authentication_failed", reason=str(exc))
        raise
    # Bound in the request's own context (async), so every later log line of the request carries them.
    structlog.contextvars.bind_contextvars(token_id=principal.token_id, tenant=principal.tenant)
    return principal


def requires(*any_of: str) -> Callable[[Principal], Principal]:
    """A dependency: the caller, who must hold one of `any_of` (admin holds every scope)."""

    def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        principal.require(*any_of)
        return principal

    return check


#: Reads: events, runs, workflows, projection health.
Reader = Annotated[Principal, Depends(requires("read"))]
#: Appending events.
Appender = Annotated[Principal, Depends(requires("append"))]
#: Starting runs: producers (append) and operators alike.
Starter = Annotated[Principal, Depends(requires("append", "operate"))]
#: Cancelling, retrying and refreshing runs.
Operator = Annotated[Principal, Depends(requires("operate"))]
#: Operator actions on projections and failures, which span tenants.
Admin = Annotated[Principal, Depends(requires("admin"))]

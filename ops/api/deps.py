"""Request dependencies: the shared services, and who is calling with which scopes.

Routes declare what they need as a type, e.g. `principal: Reader`; a request without a live bearer token
is refused with 401 before the route runs (on guarded paths before its body is read, `ops.api.authn`),
one without the scope (or role) with 403. Each guard declares its scopes as a security requirement, so
the OpenAPI document names them per operation.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Final

import structlog
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ops.api.authn import PRINCIPAL_KEY
from ops.api.jobs import BackgroundJobs
from ops.api.settings import ApiSettings
from ops.api.token_lookups import TokenLookups
from ops.auth import SERVER_ADMIN, AuthenticationError, Principal
from ops.services import Services

log = structlog.get_logger(__name__)

#: The security scheme's name in the OpenAPI document (FastAPI's name for HTTPBearer).
SECURITY_SCHEME: Final = "HTTPBearer"
_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="lf_<id>_<secret>",
    description="An API token created with `ledgerflow tokens create` (a tenant's) or "
    "`ledgerflow tokens create --server-admin` (a server administrator's).",
)


# The dependencies are async: a plain function would run on the thread pool, so a probe or a wait would
# queue behind every busy request for a thread it does not need.
async def get_services(request: Request) -> Services:
    services = request.app.state.services
    assert isinstance(services, Services)
    return services


async def get_api_settings(request: Request) -> ApiSettings:
    settings = request.app.state.api_settings
    assert isinstance(settings, ApiSettings)
    return settings


async def get_jobs(request: Request) -> BackgroundJobs:
    jobs = request.app.state.jobs
    assert isinstance(jobs, BackgroundJobs)
    return jobs


ServicesDep = Annotated[Services, Depends(get_services)]
ApiSettingsDep = Annotated[ApiSettings, Depends(get_api_settings)]
JobsDep = Annotated[BackgroundJobs, Depends(get_jobs)]


async def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    # Guarded paths were authenticated before their body was read (ops.api.authn).
    known = getattr(request.state, PRINCIPAL_KEY, None)
    if isinstance(known, Principal):
        return known
    try:
        if credentials is None:
            raise AuthenticationError("this request needs an API token: send 'Authorization: Bearer <token>'")
        tokens = request.app.state.tokens
        assert isinstance(tokens, TokenLookups)
        principal = await tokens.authenticate(credentials.credentials)
    except AuthenticationError as exc:
        log.info("api_authentication_failed", reason=str(exc))
        raise
    # Bound in the request's own context (async), so every later log line of the request carries them.
    structlog.contextvars.bind_contextvars(token_id=principal.token_id, tenant=principal.tenant)
    return principal


def requires(*any_of: str) -> Callable[[Principal], Coroutine[Any, Any, Principal]]:
    """A dependency: the caller, who must hold one of `any_of` (admin holds every scope)."""

    # async: a dependency that is a plain function runs on the thread pool, behind every busy request.
    async def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        principal.require(*any_of)
        return principal

    return check


async def require_server_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """A dependency: the caller, who must hold a server administrator's token."""
    principal.require_server_admin("this request")
    return principal


#: Reads: events, runs, workflows, projection health.
Reader = Annotated[Principal, Security(requires("read"), scopes=["read"])]
#: Appending events.
Appender = Annotated[Principal, Security(requires("append"), scopes=["append"])]
#: Starting runs: producers (append) and operators alike.
Starter = Annotated[Principal, Security(requires("append", "operate"), scopes=["append", "operate"])]
#: Cancelling, retrying and refreshing runs.
Operator = Annotated[Principal, Security(requires("operate"), scopes=["operate"])]
#: Operator actions on the tenant's failures and per-tenant projections (a server administrator: every
#: tenant's, and the shared projections too).
Admin = Annotated[Principal, Security(requires("admin"), scopes=["admin"])]
#: What only a server administrator may do, whatever the projection (e.g. `/metrics`).
ServerAdmin = Annotated[Principal, Security(require_server_admin, scopes=[SERVER_ADMIN])]

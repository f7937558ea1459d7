"""Authentication before the body: a request to a route that needs a token is checked before any byte of
its body is read or parsed.

Parsing a 2 MiB JSON body costs far more (CPU, tens of MiB) than refusing it, so an anonymous caller could
otherwise spend the server's memory with bodies it has no right to send. The token's format is checked on
the event loop (no round trip); a well-formed one is then looked up (one indexed row, kept for a few
seconds and made on a connection of its own: `ops.api.token_lookups`). The principal is
kept in the request's state, where `ops.api.deps.current_principal` takes it, so the routes' dependencies
(and the scopes they declare in the OpenAPI document) stay as they are. A refused request that carries a
body is answered with `Connection: close`, so its unread body is never read either. The tenant's
requests in flight are then counted, and one past the tenant's cap refused (`ops.api.in_flight`).
"""

from __future__ import annotations

from typing import Final

import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from eventstore import LedgerflowError
from ops.api.errors import ledgerflow_error_response
from ops.api.in_flight import RequestsInFlight
from ops.api.token_lookups import TokenLookups
from ops.auth import AuthenticationError, Principal

log = structlog.get_logger(__name__)

#: Where every route needs a token (the probes, docs and console do not).
GUARDED_PREFIXES: Final = ("/api/v1/", "/metrics")
#: The key of the request state that carries the authenticated principal.
PRINCIPAL_KEY: Final = "ledgerflow_principal"


def bearer_secret(scope: Scope) -> str:
    """The bearer secret of the request's Authorization header; AuthenticationError without one."""
    raw: bytes | None = dict(scope["headers"]).get(b"authorization")
    if raw is None:
        raise AuthenticationError("this request needs an API token: send 'Authorization: Bearer <token>'")
    scheme, _, secret = raw.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise AuthenticationError("this request needs an API token: send 'Authorization: Bearer <token>'")
    return secret.strip()


def _has_body(scope: Scope) -> bool:
    headers = dict(scope["headers"])
    declared = headers.get(b"content-length", b"0").strip()
    return declared not in (b"", b"0") or b"transfer-encoding" in headers


class AuthenticateFirstMiddleware:
    """Refuses requests to guarded paths without a live token (401, the API's error shape) before their
    body is read; keeps the principal of the others for the route's dependencies."""

    def __init__(self, app: ASGIApp, tokens: TokenLookups, in_flight: RequestsInFlight) -> None:
        self.app = app
        self.tokens = tokens
        self.in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        try:
            principal: Principal = await self.tokens.authenticate(bearer_secret(scope))
        except LedgerflowError as exc:  # not a live token's, or the lookup failed (database away: 503)
            if isinstance(exc, AuthenticationError):
                log.info("api_authentication_failed", reason=str(exc))
            response = ledgerflow_error_response(exc)
            if _has_body(scope):
                response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        # Bound in the request's own context, so every later log line of the request carries them.
        structlog.contextvars.bind_contextvars(token_id=principal.token_id, tenant=principal.tenant)
        scope.setdefault("state", {})[PRINCIPAL_KEY] = principal
        if not await self.in_flight.enter(principal.tenant):
            response = self.in_flight.refusal(principal.tenant)
            if _has_body(scope):
                response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.leave(principal.tenant)

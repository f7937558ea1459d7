"""ASGI middleware: a request id bound to every log line, the request body size limit, and the security
headers of every answer.

The size limit reads the whole body before the application sees any of it, so a refused request never
reaches a route and never writes anything. A declared Content-Length over the limit is refused without
reading; a body sent without one (chunked) is counted as it streams and refused once it passes the limit.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Final

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ops.api.errors import REQUEST_TOO_LARGE, error_body

log = structlog.get_logger(__name__)

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,100}")


class RequestContextMiddleware:
    """Binds `request_id` (the caller's X-Request-ID when sane, else a fresh one) for the request's logs,
    and returns it in the response's X-Request-ID header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"")
        request_id = given.decode() if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        with structlog.contextvars.bound_contextvars(
            request_id=request_id, method=scope["method"], path=scope["path"]
        ):
            await self.app(scope, receive, send_with_id)


#: Scripts, styles and everything else only from this server's own files: no inline script, no CDN, no
#: framing. `img-src data:` for the icons that stylesheets embed.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_SECURITY_HEADERS: Final = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)
#: Answers under these paths carry tenant data (or name tenants): never stored by a browser or a proxy.
_NO_STORE_PREFIXES: Final = ("/api/v1/", "/metrics")


class SecurityHeadersMiddleware:
    """Adds the security headers to every HTTP answer (API, console, docs, errors), and
    `Cache-Control: no-store` to every answer that carries tenant data."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        no_store = path.startswith(_NO_STORE_PREFIXES)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if not (no_store and k.lower() == b"cache-control")
                ]
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in _SECURITY_HEADERS if k not in present]
                if no_store:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimitMiddleware:
    """Refuses request bodies over `max_bytes` with 413 and the API's error shape."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, int(declared))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nothing to serve
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, size)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnect notices

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, size: int) -> None:
        log.info("api_request_too_large", size=size, limit=self.max_bytes)
        payload = json.dumps(
            error_body(
                REQUEST_TOO_LARGE,
                f"the request body is {size} bytes or more; the limit is {self.max_bytes} "
                "(LEDGERFLOW_MAX_REQUEST_BYTES); nothing was written",
                {"limit": self.max_bytes},
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

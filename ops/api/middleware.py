"""ASGI middleware: a request id bound to every log line, and the request body size limit.

The size limit reads the whole body before the application sees any of it, so a refused request never
reaches a route and never writes anything. A declared Content-Length over the limit is refused without
reading; a body sent without one (chunked) is counted as it streams and refused once it passes the limit.
"""

from __future__ import annotations

import json
import re
import uuid

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

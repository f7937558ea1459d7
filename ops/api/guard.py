"""Refuses requests whose text is not honest UTF-8, or whose body is not declared JSON, before any route
sees them.

A path, query string, JSON body or header the API reads that is not valid UTF-8 answers 400
`invalid_utf8`; a path or query that carries a NUL character answers 400 `invalid_input`. Without this,
the server would decode invalid bytes to U+FFFD, so different stream names would silently become one.
A body sent to the API without `Content-Type: application/json` (curl's `-d` says form data) answers 415
naming the header, rather than a 422 that does not say why.
"""

from __future__ import annotations

import codecs
import json
from urllib.parse import unquote_to_bytes

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ops.api.errors import error_body

log = structlog.get_logger(__name__)

INVALID_UTF8 = "invalid_utf8"
#: The request headers the API reads; others pass as they are.
_READ_HEADERS = (b"authorization", b"idempotency-key", b"if-match", b"x-request-id", b"content-type")
_BODY_METHODS = (b"POST", b"PUT", b"PATCH")


def _decoded(raw: bytes, what: str) -> tuple[str, str] | None:
    """(code, message) when percent-decoded `raw` is not UTF-8 or holds a NUL; else None."""
    data = unquote_to_bytes(raw)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return INVALID_UTF8, f"the {what} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at {exc.start})"
    if b"\x00" in data:
        return "invalid_input", f"the {what} contains a NUL character (%00), which no name may hold"
    return None


def _problem(scope: Scope) -> tuple[str, str] | None:
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    found = _decoded(raw_path.split(b"?", 1)[0], "path")
    if found:
        return found
    for part in scope.get("query_string", b"").split(b"&"):
        if found := _decoded(part.replace(b"+", b" "), "query string"):
            return found
    for name, value in scope["headers"]:
        if name in _READ_HEADERS:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return INVALID_UTF8, f"the {name.decode()} header is not valid UTF-8"
    return None


def _undeclared_body(scope: Scope) -> bool:
    """A body sent to the API under another content type than JSON (or none)."""
    if scope["method"].encode() not in _BODY_METHODS or not scope["path"].startswith("/api/"):
        return False
    headers = dict(scope["headers"])
    if b"json" in headers.get(b"content-type", b"").lower():
        return False
    has_body = headers.get(b"content-length", b"0").strip() not in (b"", b"0")
    return has_body or b"transfer-encoding" in headers


def _json_body(scope: Scope) -> bool:
    if scope["method"].encode() not in _BODY_METHODS:
        return False
    content_type = dict(scope["headers"]).get(b"content-type", b"").lower()
    return not content_type or b"json" in content_type


class RequestGuardMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _undeclared_body(scope):
            await _refuse(
                send,
                415,
                "unsupported_media_type",
                "the request body must be JSON: send the header `Content-Type: application/json` "
                "(curl: -H 'Content-Type: application/json'); nothing was written",
            )
            return
        problem = _problem(scope)
        if problem is None and _json_body(scope):
            messages: list[Message] = []
            decoder = codecs.getincrementaldecoder("utf-8")("strict")
            offset = 0
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                chunk: bytes = message.get("body", b"")
                more = bool(message.get("more_body", False))
                try:
                    decoder.decode(chunk, final=not more)
                except UnicodeDecodeError as exc:
                    problem = (
                        INVALID_UTF8,
                        (
                            f"the request body is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at "
                            f"{offset + exc.start}); JSON must be UTF-8; nothing was written"
                        ),
                    )
                    break
                offset += len(chunk)
                if not more:
                    break
            queued = iter(messages)

            async def replay() -> Message:
                return next(queued, None) or await receive()

            if problem is None:
                await self.app(scope, replay, send)
                return
        if problem is None:
            await self.app(scope, receive, send)
            return
        await _refuse(send, 400, *problem)


async def _refuse(send: Send, status: int, code: str, message_text: str) -> None:
    log.info("api_request_refused", code=code, reason=message_text)
    payload = json.dumps(error_body(code, message_text)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})

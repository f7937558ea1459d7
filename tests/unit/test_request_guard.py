"""The request guard refuses text that is not UTF-8, at the ASGI level (test clients re-encode headers)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from ops.api.guard import RequestGuardMiddleware


async def _reached(scope: Scope, receive: Receive, send: Send) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def call(
    path: bytes = b"/api/v1/events",
    query: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    body: list[bytes] | None = None,
    method: str = "GET",
) -> tuple[int, bytes]:
    scope: Scope = {
        "type": "http",
        "method": method,
        "path": path.decode("utf-8", "replace"),
        "raw_path": path,
        "query_string": query,
        "headers": headers or [],
    }
    chunks = list(body or [b""])
    sent: list[Message] = []

    async def receive() -> Message:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: Message) -> None:
        sent.append(message)

    # In a thread of its own: a test run may already have an event loop running in this one (the
    # browser tests' synchronous Playwright keeps one), and asyncio.run refuses to nest.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, RequestGuardMiddleware(_reached)(scope, receive, send)).result()
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def error(body: bytes) -> dict[str, Any]:
    return dict(json.loads(body)["error"])


@pytest.mark.parametrize(
    "name", [b"authorization", b"idempotency-key", b"if-match", b"x-request-id", b"content-type"]
)
def test_a_read_header_that_is_not_utf8_is_refused(name: bytes) -> None:
    status, body = call(headers=[(name, b"k\xc3(")])
    assert status == 400
    assert error(body)["code"] == "invalid_utf8"
    assert f"the {name.decode()} header is not valid UTF-8" in error(body)["message"]


def test_other_headers_pass() -> None:
    assert call(headers=[(b"user-agent", b"\xff")])[0] == 200


def test_a_body_split_inside_a_character_passes_and_reaches_the_app_whole() -> None:
    text = '{"name": "café"}'.encode()
    cut = text.index(b"\xa9")  # between the two bytes of é
    status, body = call(method="POST", body=[text[:cut], text[cut:]])
    assert (status, body) == (200, text)


def test_a_body_that_is_not_utf8_is_refused_with_its_offset() -> None:
    status, body = call(method="POST", body=[b'{"a": "', b'caf\xe9"}'])
    assert status == 400
    assert "not valid UTF-8 (byte 0xe9 at 10)" in error(body)["message"]


def test_a_non_json_body_is_not_checked() -> None:
    headers = [(b"content-type", b"application/octet-stream")]
    assert call(method="POST", headers=headers, body=[b"\xff"])[0] == 200


@pytest.mark.parametrize(
    ("path", "query", "code"),
    [
        (b"/api/v1/streams/a%FF", b"", "invalid_utf8"),
        (b"/api/v1/streams/a%00", b"", "invalid_input"),
        (b"/api/v1/events", b"type=a%FFb", "invalid_utf8"),
        (b"/api/v1/events", b"type=a\xffb", "invalid_utf8"),
        (b"/api/v1/events", b"type=a%00", "invalid_input"),
    ],
)
def test_paths_and_queries(path: bytes, query: bytes, code: str) -> None:
    status, body = call(path=path, query=query)
    assert status == 400
    assert error(body)["code"] == code


def test_utf8_paths_and_queries_pass() -> None:
    assert call(path="/api/v1/streams/café".encode(), query="type=%C3%A9&x=é".encode())[0] == 200

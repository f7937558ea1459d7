"""Browser and HTTP hardening: security headers on every answer, no-store on tenant data, /api/docs from
local files only, the scope of each operation in the OpenAPI document, /metrics for server
administrators only."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ops.api.middleware import CONTENT_SECURITY_POLICY
from ops.console import STATIC_DIR
from ops.metrics_endpoint import add_metrics_route
from ops.services import Services
from tests.api.helpers import Headers, MakeToken, events_body
from tests.api.roles import server_admin, tenant_admin


def assert_security_headers(headers: dict[str, str] | object, where: str) -> None:
    h = headers  # httpx.Headers: case-insensitive
    csp = h["content-security-policy"]  # type: ignore[index]
    assert "script-src 'self'" in csp, where
    assert "unsafe-inline" not in csp, where
    assert "unsafe-eval" not in csp, where
    assert "frame-ancestors 'none'" in csp, where
    assert h["x-content-type-options"] == "nosniff", where  # type: ignore[index]
    assert h["x-frame-options"] == "DENY", where  # type: ignore[index]
    assert h["referrer-policy"] == "no-referrer", where  # type: ignore[index]


def test_every_api_answer_carries_the_security_headers_and_no_store(
    client: TestClient, admin: Headers
) -> None:
    answers = {
        "ok": client.get("/api/v1/runs", headers=admin),
        "created": client.post("/api/v1/streams/order-1/events", json=events_body(), headers=admin),
        "read": client.get("/api/v1/streams/order-1", headers=admin),
        "unauthenticated": client.get("/api/v1/runs"),
        "not found": client.get("/api/v1/runs/00000000-0000-0000-0000-000000000001", headers=admin),
        "invalid": client.post("/api/v1/streams/order-1/events", json={"events": 1}, headers=admin),
        "too large": client.post(
            "/api/v1/streams/order-1/events",
            content=b"x" * (3 * 1024 * 1024),
            headers={**admin, "Content-Type": "application/json"},
        ),
        "no route": client.get("/api/v1/nothing-here", headers=admin),
    }
    for what, response in answers.items():
        assert_security_headers(response.headers, what)
        assert response.headers["cache-control"] == "no-store", what
    assert [answers[k].status_code for k in ("ok", "created", "unauthenticated", "too large")] == [
        200,
        201,
        401,
        413,
    ]


@pytest.mark.parametrize(
    "path", ["/console/", "/console/main.js", "/api/docs", "/api/openapi.json", "/api/healthz"]
)
def test_console_docs_and_probes_carry_the_security_headers(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert_security_headers(response.headers, path)


class _Page(HTMLParser):
    """What a page loads, and whether it has inline script."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts = 0
        self.handlers: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.handlers += [k for k in a if k.startswith("on")]
        if tag == "script":
            self._in_script = "src" not in a
        for key in ("src", "href"):
            if a.get(key) and tag in ("script", "link", "img"):
                self.urls.append(str(a[key]))

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def test_api_docs_load_only_local_assets_and_no_inline_script(client: TestClient) -> None:
    response = client.get("/api/docs")
    assert response.headers["content-type"].startswith("text/html")
    page = parse(response.text)
    assert (page.inline_scripts, page.handlers) == (0, [])
    assert len(page.urls) >= 3
    for url in page.urls:
        assert re.match(r"/[^/]", url), url  # this server, never a CDN
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url
    assert not re.search(r"https?://", response.text)
    scripts = [u for u in page.urls if u.endswith(".js")]
    assert any("swagger-ui-bundle" in u for u in scripts)
    # The start-up script points Swagger UI at this server's document.
    start = client.get(next(u for u in scripts if "swagger-ui-bundle" not in u)).text
    assert "/api/openapi.json" in start


def test_the_console_has_no_inline_script_or_handler() -> None:
    for html in STATIC_DIR.glob("*.html"):
        page = parse(html.read_text(encoding="utf-8"))
        assert (page.inline_scripts, page.handlers) == (0, []), html.name
        assert all(u.startswith(("/", "./")) or "://" not in u for u in page.urls), html.name
    for js in STATIC_DIR.glob("*.js"):
        text = js.read_text(encoding="utf-8")
        assert "eval(" not in text, js.name
        assert "new Function" not in text, js.name
        assert "innerHTML" not in text, js.name


def test_the_content_security_policy_allows_no_inline_script() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'"
    assert directives["object-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"


def test_openapi_names_the_security_scheme_and_each_operations_scope(client: TestClient) -> None:
    schema = client.get("/api/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    expected = {
        ("post", "/api/v1/streams/{stream_id}/events"): ["append"],
        ("get", "/api/v1/runs"): ["read"],
        ("post", "/api/v1/workflows/{workflow}/runs"): ["append", "operate"],
        ("post", "/api/v1/runs/{run_id}/cancel"): ["operate"],
        ("get", "/api/v1/failures"): ["admin"],
        ("post", "/api/v1/projections/{name}/rebuild"): ["admin"],
    }
    for (method, path), scopes in expected.items():
        operation = schema["paths"][path][method]
        assert operation["x-required-scope"] == scopes, path
        # Any one of the scopes suffices: one security requirement each.
        assert operation["security"] == [{"HTTPBearer": [s]} for s in scopes], path
        assert "Requires a token with scope" in operation["description"], path
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if path.startswith("/api/v1/"):
                assert operation.get("x-required-scope"), (method, path)
            else:  # the probes need no token
                assert "security" not in operation, (method, path)
    for lever in ("rebuild", "verify", "replay"):
        operation = schema["paths"][f"/api/v1/projections/{{name}}/{lever}"]["post"]
        assert operation["x-shared-projection-requires"] == "server_admin"
        assert "server administrator" in operation["description"]
        answer = operation["responses"]["202"]["content"]["application/json"]["schema"]["$ref"]
        assert answer == "#/components/schemas/RunAccepted"
    assert set(schema["components"]["schemas"]["RunAccepted"]["properties"]) == {"run_id", "kind", "note"}


@pytest.fixture
def metrics_client(app: FastAPI) -> Iterator[TestClient]:
    add_metrics_route(app)
    with TestClient(app) as c:
        yield c


def test_metrics_answer_only_a_server_administrator(
    metrics_client: TestClient, services: Services, make_token: MakeToken
) -> None:
    # Something with a tenant in its labels.
    response = metrics_client.post(
        "/api/v1/streams/order-1/events", json=events_body(), headers=make_token("append", tenant="secret-co")
    )
    assert response.status_code == 201

    anonymous = metrics_client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "unauthenticated"
    for headers in (tenant_admin(services, "secret-co"), make_token("read", tenant="other")):
        refused = metrics_client.get("/metrics", headers=headers)
        assert refused.status_code == 403
        assert refused.json()["error"]["details"]["required_any_of"] == ["server_admin"]
    allowed = metrics_client.get("/metrics", headers=server_admin(services))
    assert allowed.status_code == 200
    assert allowed.headers["content-type"].startswith("text/plain")
    assert allowed.headers["cache-control"] == "no-store"
    assert_security_headers(allowed.headers, "/metrics")


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_body_not_declared_json_gets_415_naming_the_header(
    client: TestClient, admin: Headers, services: Services, content_type: str | None
) -> None:
    headers = dict(admin) | ({"Content-Type": content_type} if content_type else {})
    body = json.dumps(events_body("OrderPlaced"))
    response = client.post("/api/v1/streams/order-1/events", content=body, headers=headers)
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert "Content-Type: application/json" in error["message"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert services.store.stream_version("order-1", tenant="acme") is None, "nothing was written"


def test_bodiless_posts_need_no_content_type(client: TestClient, admin: Headers) -> None:
    started = client.post("/api/v1/workflows/linear/runs", json={"input": {}}, headers=admin)
    assert started.status_code in (201, 202), started.text
    run_id = started.json()["run_id"]
    cancelled = client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin)
    assert cancelled.status_code != 415, cancelled.text

"""The console and /api/docs in a real browser under the Content-Security-Policy: no violation, /api/docs
with every request to other hosts refused (no internet), and a tenant's admin refused on a projection
every tenant reads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from ops.auth import create_token
from tests.browser.conftest import Console, confirm, shot, sign_in, watch_csp


@pytest.fixture
def offline(browser: Browser, console: Console) -> Iterator[tuple[BrowserContext, list[str]]]:
    """A browser context that can reach the console's server and nothing else; the list collects the
    URLs it tried elsewhere."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(30_000)
    elsewhere: list[str] = []
    local = urlsplit(console.url).netloc

    def only_local(route: Route) -> None:
        if urlsplit(route.request.url).netloc == local:
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_local)
    yield context, elsewhere
    context.close()


def test_api_docs_work_with_no_internet(offline: tuple[BrowserContext, list[str]], console: Console) -> None:
    context, elsewhere = offline
    page = context.new_page()
    violations = watch_csp(page)
    response = page.goto(console.url + "/api/docs")
    assert response is not None
    assert response.status == 200
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("ledgerflow")
    rebuild = page.locator(".opblock-summary-path[data-path='/api/v1/projections/{name}/rebuild']")
    expect(rebuild).to_be_visible()
    rebuild.click()  # its description names the scope it needs
    expect(page.locator(".opblock-description-wrapper").first).to_contain_text("server administrator")
    expect(page.locator(".swagger-ui .authorize")).to_be_visible()  # the bearer scheme
    shot(page, "api-docs-offline")
    assert elsewhere == []
    assert violations == []


def test_a_tenant_admin_is_refused_a_shared_projection_in_the_console(page: Page, console: Console) -> None:
    _, tenant_token = create_token(console.services.store, tenant="acme", scopes=["admin"], name="acme")
    sign_in(page, tenant_token)
    page.click("nav a[data-nav=projections]")
    expect(page.locator("[data-testid=projection-row][data-name=workflow_tables]")).to_be_visible()
    page.click("[data-testid=rebuild-workflow_tables]")
    confirm(page, names="Rebuild workflow_tables")
    banner = page.locator("[data-testid=banner]")
    expect(banner).to_have_attribute("data-kind", "error")
    expect(page.locator("[data-testid=error-code]")).to_have_text("forbidden")
    expect(page.locator("[data-testid=error-message]")).to_contain_text("server administrator")
    shot(page, "tenant-admin-refused-shared-projection")
    # Its own slice of a per-tenant projection is its to verify.
    page.click("[data-testid=verify-stream_catalogue]")
    confirm(page, names="Verify stream_catalogue")
    expect(page).to_have_url(re.compile(r"#/projections/stream_catalogue$"))
    expect(page.locator("[data-testid=notice]")).to_contain_text("verify of stream_catalogue requested")
    run = page.locator("[data-testid=projection-run][data-kind=verify]").first
    expect(run).to_have_attribute("data-status", "completed")

"""The real app (API and console) under uvicorn on a free localhost port, with an in-process workflow worker
and projector worker, driven by a headless Chromium from the system (never a downloaded one).

Every test gets its own database, server and workers; the browser is shared by the session.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from ops.api.app import create_app
from ops.auth import create_token
from ops.console import mount_console
from ops.metrics_endpoint import add_metrics_route
from ops.services import Services, open_services
from ops.settings import Settings
from projector import ProjectorWorker, RetrySettings
from projector import WorkerSettings as ProjectorSettings
from tests.browser.console_projections import REBUILDS_MAY_PASS
from tests.flows import GATES
from tests.projections import POISONED
from tests.waiting import wait_until
from workflows import WorkerSettings, WorkflowWorker

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Runs take a moment to finish and the run table trails the log by the projector's lag.
expect.set_options(timeout=30_000)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")
    for item in items:
        if "tests/browser/" in item.nodeid:
            item.add_marker(skip)


@dataclass
class Console:
    url: str
    token: str
    services: Services


#: The workflows and projections every console test serves.
WORKFLOWS = "tests.flows:registry,tests.browser.console_flows:registry"
PROJECTIONS = "tests.projections:counter"


@pytest.fixture
def console(database_url: str) -> Iterator[Console]:
    with serve_console(database_url) as served:
        yield served


@contextmanager
def serve_console(
    database_url: str, *, projections: str = PROJECTIONS, batch_size: int = 1000
) -> Iterator[Console]:
    """The app, a workflow worker and a projector worker on `database_url`, stopped at the end."""
    settings = Settings(
        database_url=database_url,
        workflows=WORKFLOWS,
        projections=projections,
        projector_batch_size=batch_size,
    )
    services = open_services(settings)
    # A server administrator's token: the console rebuilds projections that every tenant reads.
    _, token = create_token(
        services.store, tenant="default", scopes=["admin"], name="browser", server_admin=True
    )
    app = create_app(services)
    add_metrics_route(app)
    if not any(getattr(r, "path", None) == "/console" for r in app.routes):  # unless create_app did
        mount_console(app)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    worker = WorkflowWorker(
        services.engine,
        services.registry,
        WorkerSettings(poll_interval=0.05, shutdown_grace=1),
        name="browser",
    )
    projector = ProjectorWorker(
        services.store,
        services.projections,
        ProjectorSettings(
            poll_interval=0.1,
            batch_size=batch_size,
            retry=RetrySettings(initial_backoff=0.001, max_backoff=0.01),
        ),
    )
    threads = [
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="api", daemon=True),
        threading.Thread(target=worker.run, name="workflow-worker", daemon=True),
        threading.Thread(target=projector.run, name="projector", daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: server.started, timeout=15, what="uvicorn to start")
        yield Console(f"http://127.0.0.1:{sock.getsockname()[1]}", token, services)
    finally:
        for gate in list(GATES.values()):
            gate.set()  # let gated nodes end so the worker can stop
        REBUILDS_MAY_PASS.set()  # and held rebuilds, so the API's jobs can end
        POISONED.clear()
        server.should_exit = True
        worker.stop()
        projector.stop()
        for t in threads:
            t.join(timeout=20)
        sock.close()
        services.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, console: Console, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page signed in through the console's token form, at the runs list; screenshot kept at the end."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    violations = watch_csp(page)
    page.goto(console.url + "/")
    expect(page).to_have_url(re.compile(r"/console/#/runs$"))
    expect(page.locator("[data-testid=notice]")).to_contain_text("API token")  # asked for before anything
    sign_in(page, console.token)
    yield page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}-end.png"), full_page=True)
    context.close()
    assert violations == [], "the page broke its Content-Security-Policy"


def sign_in(page: Page, token: str) -> None:
    """Enter `token` in the token form; return once the API accepted it."""
    page.fill("#token-input", token)
    page.click("#token-save")  # the state reads "checking" from here until the API answers
    expect(page.locator("#token-state")).to_have_attribute("data-state", "accepted")


def confirm(page: Page, *, names: str) -> None:
    """Accept the confirmation the last click opened, after checking that it names `names`."""
    dialog = page.locator("[data-testid=confirm-dialog]")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(names)
    page.click("[data-testid=confirm-ok]")
    expect(dialog).to_be_hidden()


def watch_csp(page: Page) -> list[str]:
    """The Content-Security-Policy violations the page reports on its console, as they happen."""
    violations: list[str] = []
    page.on(
        "console",
        lambda message: (
            violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return violations


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

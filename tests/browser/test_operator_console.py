"""What an operator needs from the console, in a real browser against the real API and workers: the DAG
laid out from the definition, a node's output and error on click, a confirmation before every lever that
does nothing when declined, clear answers to a bad token, and a rebuild that shows where it is."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from playwright.sync_api import Browser, Page, Request, expect

from eventstore import NewEvent
from ops.api.settings import ApiSettings
from ops.auth import AuthenticationError, authenticate, create_token, revoke_token
from tests.browser.conftest import Console, confirm, serve_console, shot, sign_in, watch_csp
from tests.browser.console_flows import FANOUT_EDGES
from tests.browser.console_projections import REBUILDS_MAY_PASS
from tests.browser.test_console import at, expect_run, node, start_run
from tests.flows import GATES
from tests.projections import POISONED
from tests.waiting import wait_until


def posts(page: Page) -> list[str]:
    """The paths of the POST requests the page sends from now on, as they are sent."""
    sent: list[str] = []

    def record(request: Request) -> None:
        if request.method == "POST":
            sent.append(re.sub(r"^https?://[^/]+", "", request.url))

    page.on("request", record)
    return sent


def decline(page: Page, *, names: str, how: str) -> None:
    """Answer the open confirmation with no (`how`: the Cancel button, Escape, or Enter on the default)."""
    dialog = page.locator("[data-testid=confirm-dialog]")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(names)
    expect(page.locator("[data-testid=confirm-cancel]")).to_be_focused()  # the default
    if how == "button":
        page.click("[data-testid=confirm-cancel]")
    else:
        page.keyboard.press(how)
    expect(dialog).to_be_hidden()


# -- the DAG ------------------------------------------------------------------------------------------


def test_a_fan_out_is_laid_out_in_layers_with_an_edge_per_dependency(page: Page) -> None:
    start_run(page, "fanout", {"parts": [1, 2, 3]})
    expect_run(page, "succeeded")
    layer = {
        n: int(node(page, n).get_attribute("data-layer") or -1)
        for n in ("split", "double", "square", "negate", "total", "merge")
    }
    # Layers by the longest path from the root: merge waits for total, so it sits below it.
    assert layer == {"split": 0, "double": 1, "square": 1, "negate": 1, "total": 2, "merge": 3}
    where = {n: at(node(page, n)) for n in layer}
    fanned = ("double", "square", "negate")
    assert len({where[n][1] for n in fanned}) == 1, "one layer, one row"
    xs = sorted(where[n][0] for n in fanned)
    assert xs[0] < xs[1] < xs[2], "the fan-out side by side"
    assert where["split"][1] < where["double"][1] < where["total"][1] < where["merge"][1]

    edges = page.locator("[data-testid=dag] [data-edge]")
    expect(edges).to_have_count(len(FANOUT_EDGES))
    assert {edges.nth(i).get_attribute("data-edge") for i in range(edges.count())} == FANOUT_EDGES
    # Each edge leaves the bottom of its dependency and ends at the top of its node.
    for edge in FANOUT_EDGES:
        source, target = edge.split("->")
        d = page.locator(f"[data-edge='{edge}']").get_attribute("d") or ""
        numbers = [float(v) for v in re.findall(r"-?[\d.]+", d)]
        (x1, y1), (x2, y2) = numbers[:2], numbers[-2:]
        assert where[source][1] < y1 < where[target][1]
        assert y2 == where[target][1]
        assert x1 > where[source][0]
        assert x2 > where[target][0]
    shot(page, "dag-fanout")


def test_a_run_the_server_has_no_definition_for_says_so(
    page: Page, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = start_run(page, "linear")
    expect_run(page, "succeeded")
    expect(page.locator("[data-testid=definition-unknown]")).to_be_hidden()
    expect(page.locator("#run-meta")).to_contain_text("linear · version 1")  # the version it started with
    # The same run seen by a server that was started without the workflow's module (or that version).
    registry = console.services.registry
    versions = registry.versions
    monkeypatch.setattr(registry, "versions", lambda name: [] if name == "linear" else versions(name))
    page.reload()
    unknown = page.locator("[data-testid=definition-unknown]")
    expect(unknown).to_be_visible()
    expect(unknown).to_contain_text("does not have version 1 of workflow linear")
    expect(unknown).to_contain_text("LEDGERFLOW_WORKFLOWS")
    expect(node(page, "third")).to_have_attribute("data-status", "succeeded")
    assert run_id in page.url


# -- a node's output and error ------------------------------------------------------------------------


def test_a_nodes_output_opens_on_click(page: Page) -> None:
    start_run(page, "fanout", {"parts": [1, 2, 3]})
    expect_run(page, "succeeded")
    panel = page.locator("[data-testid=node-panel]")
    expect(panel).to_be_hidden()
    node(page, "merge").click()
    expect(panel).to_be_visible()
    expect(panel.locator("h3")).to_contain_text("merge")
    output = panel.locator("[data-testid=node-output]")
    expect(output).to_contain_text('"total": -6')
    assert json.loads(output.text_content() or "") == {"double": [2, 4, 6], "square": [1, 4, 9], "total": -6}
    expect(panel.locator("[data-testid=node-error]")).to_have_text("none")
    expect(node(page, "merge")).to_have_class(re.compile(r"\bselected\b"))
    shot(page, "node-output")

    node(page, "square").focus()  # the keyboard opens it too
    page.keyboard.press("Enter")
    expect(panel.locator("h3")).to_contain_text("square")
    assert json.loads(output.text_content() or "") == [1, 4, 9]
    page.click("#node-close")
    expect(panel).to_be_hidden()


def test_a_failed_nodes_error_opens_on_click(page: Page) -> None:
    start_run(page, "flaky", {"fail_times": 3})
    expect_run(page, "failed")
    node(page, "flaky").click()
    panel = page.locator("[data-testid=node-panel]")
    expect(panel.locator("[data-testid=node-error]")).to_contain_text("attempt 3 fails on purpose")
    expect(panel.locator("[data-testid=node-output]")).to_have_text("no output yet: the node failed")
    shot(page, "node-error")


def test_the_open_node_follows_the_run_live(page: Page) -> None:
    run_id = start_run(page, "gated", key=f"gate-{uuid.uuid4().hex[:6]}")
    gate = node(page, "wait_gate")
    expect(gate).to_have_attribute("data-status", "running")
    gate.click()
    output = page.locator("[data-testid=node-panel] [data-testid=node-output]")
    expect(output).to_have_text("no output yet: the node is running")
    GATES.setdefault(run_id, threading.Event()).set()
    expect_run(page, "succeeded")
    expect(output).to_have_text('"through"')  # read again once the node succeeded, without a click


# -- confirmations ------------------------------------------------------------------------------------


def test_run_levers_ask_first_and_do_nothing_when_declined(page: Page) -> None:
    run_id = start_run(page, "gated", key=f"gate-{uuid.uuid4().hex[:6]}")
    sent = posts(page)
    gate = node(page, "wait_gate")
    expect(gate).to_have_attribute("data-status", "running")

    for how in ("button", "Escape", "Enter"):
        page.click("#run-cancel")
        decline(page, names="Cancel gated run", how=how)
    dialog = page.locator("[data-testid=confirm-dialog]")
    page.click("#run-cancel")
    expect(dialog).to_contain_text("the running node(s) wait_gate stop at their next call")
    shot(page, "confirm-cancel-run")
    decline(page, names="Keep it running", how="button")
    assert sent == []
    expect(gate).to_have_attribute("data-status", "running")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "running")

    page.click("#run-cancel")
    confirm(page, names="Cancel gated run")
    expect_run(page, "cancelled")
    assert sent == [f"/api/v1/runs/{run_id}/cancel"]

    page.click("#run-retry")
    decline(page, names="its wait_gate node(s)", how="Escape")
    expect_run(page, "cancelled")
    GATES.setdefault(run_id, threading.Event()).set()
    page.click("#run-retry")
    confirm(page, names="Retry gated run")
    expect_run(page, "succeeded")

    page.fill("#refresh-input", json.dumps({"changed": True}))
    page.click("#run-refresh")
    decline(page, names='Input: {"changed":true}', how="button")
    expect(page.locator("[data-testid=notice]")).to_have_count(0)
    assert sent == [f"/api/v1/runs/{run_id}/cancel", f"/api/v1/runs/{run_id}/retry"]
    expect(node(page, "after_gate")).to_contain_text("#1")  # not re-run


def test_projection_levers_ask_first_and_do_nothing_when_declined(page: Page, console: Console) -> None:
    start_run(page, "linear")
    expect_run(page, "succeeded")
    page.goto(page.url.split("#")[0] + "#/projections/test_counter")
    row = page.locator("[data-testid=projection-row][data-name=test_counter]")
    expect(row).to_have_attribute("data-state", "running")
    sent = posts(page)
    runs = page.locator("[data-testid=projection-run]")
    expect(runs.first).to_be_visible()
    before = runs.count()

    page.click("[data-testid=rebuild-test_counter]")
    dialog = page.locator("[data-testid=confirm-dialog]")
    expect(dialog).to_contain_text("rebuilt from the whole log (every event in it")
    decline(page, names="Rebuild test_counter", how="button")
    page.click("[data-testid=verify-test_counter]")
    expect(dialog).to_contain_text("costs as much as a rebuild")
    decline(page, names="Verify test_counter", how="Escape")
    page.fill("#replay-after", "0:0")
    page.click("#replay-submit")
    decline(page, names="Replay test_counter after 0:0", how="Enter")

    POISONED.add("c1")  # a failure to retry and to skip
    console.services.store.append("acct-9", [NewEvent("Add", {"poison": "c1"})])
    failure = page.locator("#projection-failures [data-testid=failure-row]")
    expect(failure).to_have_count(1)
    failure.locator("button", has_text="Skip").click()
    decline(page, names="never applied to test_counter", how="button")
    failure.locator("button", has_text="Retry").click()
    decline(page, names="applies the Add event", how="Escape")

    assert sent == []
    expect(failure).to_have_count(1)
    expect(row).to_have_attribute("data-state", "blocked")
    expect(runs).to_have_count(before)
    expect(page.locator("[data-testid=notice]")).to_have_count(0)

    failure.locator("button", has_text="Skip").click()
    confirm(page, names="Skip failure")
    expect(failure).to_have_count(0)
    assert [path.rsplit("/", 1)[1] for path in sent] == ["skip"]


# -- tokens -------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_page(browser: Browser, console: Console) -> Iterator[Page]:
    """A page with no token yet."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    violations = watch_csp(page)
    page.goto(console.url + "/console/")
    yield page
    context.close()
    assert violations == []


def token_refused(page: Page, message: str | re.Pattern[str]) -> None:
    state = page.locator("#token-state")
    expect(state).to_have_attribute("data-state", "refused")
    expect(state).not_to_contain_text("token set")
    expect(page.locator("[data-testid=banner]")).to_have_attribute("data-kind", "error")
    expect(page.locator("[data-testid=error-code]")).to_have_text("unauthenticated")
    expect(page.locator("[data-testid=error-message]")).to_contain_text(message)
    expect(page.locator("[data-testid=error-next]")).to_contain_text("ledgerflow tokens create")


def test_a_token_is_checked_against_the_api_when_entered(fresh_page: Page, console: Console) -> None:
    page = fresh_page
    expect(page.locator("#token-state")).to_have_attribute("data-state", "none")
    expect(page.locator("[data-testid=notice]")).to_contain_text("Paste an API token")

    page.fill("#token-input", "not-a-token")
    page.click("#token-save")
    token_refused(page, "the bearer token is malformed")
    expect(page.locator("[data-testid=runs-table]")).to_have_count(0)
    shot(page, "token-malformed")

    page.fill("#token-input", f"lf_{'0' * 16}_{'x' * 43}")  # shaped right, never issued
    page.click("#token-save")
    token_refused(page, "the bearer token is not valid")

    store = console.services.store
    lifetime = timedelta(seconds=1)
    _, expired = create_token(store, tenant="default", scopes=["read"], name="short", expires_in=lifetime)

    def has_expired() -> bool:
        try:
            authenticate(store, expired)
        except AuthenticationError:
            return True
        return False

    wait_until(has_expired, timeout=10, what="the token to expire")
    page.fill("#token-input", expired)
    page.click("#token-save")
    token_refused(page, re.compile(r"the bearer token expired at .*; create a new one"))
    shot(page, "token-expired")
    assert page.evaluate("localStorage.getItem('ledgerflow.token')") is None  # refused tokens are not kept

    sign_in(page, console.token)
    expect(page.locator("#token-state")).to_have_text("token accepted")
    expect(page.locator("[data-testid=runs-table]")).to_be_visible()
    expect(page.locator("[data-testid=banner]")).to_be_hidden()


def test_a_token_revoked_while_in_use_is_reported(page: Page, console: Console) -> None:
    token_id, secret = create_token(console.services.store, tenant="default", scopes=["admin"], name="soon")
    sign_in(page, secret)
    expect(page.locator("[data-testid=runs-table]")).to_be_visible()
    revoke_token(console.services.store, token_id)
    # The saved token is checked again on every load; the API keeps a lookup for
    # LEDGERFLOW_TOKEN_CACHE_SECONDS, so the revocation shows on a load within that time.
    deadline = time.monotonic() + ApiSettings().token_cache_seconds + 10
    while True:
        page.reload()
        try:
            expect(page.locator("#token-state")).to_have_attribute("data-state", "refused", timeout=1000)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    token_refused(page, "the bearer token was revoked")
    assert page.evaluate("localStorage.getItem('ledgerflow.token')") is None
    sign_in(page, console.token)
    expect(page.locator("[data-testid=runs-table]")).to_be_visible()


# -- long operations ----------------------------------------------------------------------------------


@pytest.fixture
def slow_console(database_url: str) -> Iterator[Console]:
    """The console with a projection whose rebuilds a test can hold, in batches of 10 events."""
    with serve_console(
        database_url, projections="tests.browser.console_projections:held", batch_size=10
    ) as served:
        yield served


def test_a_rebuild_shows_its_total_rate_and_time_left(browser: Browser, slow_console: Console) -> None:
    store = slow_console.services.store
    store.append("held-1", [NewEvent("Seen", {"i": i}) for i in range(150)])
    store.append("held-2", [NewEvent("Seen", {"hold_rebuild": True})])
    store.append("held-3", [NewEvent("Seen", {"i": i}) for i in range(49)])
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    try:
        page.goto(slow_console.url + "/console/#/projections/test_held")
        sign_in(page, slow_console.token)
        row = page.locator("[data-testid=projection-row][data-name=test_held]")
        expect(row).to_contain_text("0 (0 to head)")  # the live projection has caught up with all 200

        REBUILDS_MAY_PASS.clear()
        page.click("[data-testid=rebuild-test_held]")
        confirm(page, names="Rebuild test_held")
        ongoing = page.locator("[data-testid=ongoing-run][data-kind=rebuild]")
        expect(ongoing).to_be_visible()
        # Held at the 151st event: the batches before it are done, the rest is to come.
        expect(ongoing.locator("[data-testid=op-done]")).to_have_text("150 events read")
        expect(ongoing.locator("[data-testid=op-total]")).to_have_attribute("data-total", "200")
        expect(ongoing.locator("[data-testid=op-total]")).to_have_text("75% of 200 events")
        expect(ongoing.locator("[data-testid=op-rate]")).to_have_text(re.compile(r"^[\d,]+ events/s$"))
        time_left = re.compile(r"^(under 1 s|about \d+ (s|min \d+ s)) left$")
        expect(ongoing.locator("[data-testid=op-left]")).to_have_text(time_left)
        assert ongoing.locator("[data-testid=op-bar]").get_attribute("value") == "75"
        shot(page, "rebuild-in-progress")

        REBUILDS_MAY_PASS.set()
        rebuild = page.locator("[data-testid=projection-run][data-kind=rebuild]").first
        expect(rebuild).to_have_attribute("data-status", "completed")
        expect(ongoing).to_have_count(0)
        expect(rebuild.locator("[data-testid=op-total]")).to_have_text("all 200 events")
        expect(rebuild.locator("[data-testid=op-left]")).to_have_text("done")
        expect(rebuild.locator("[data-testid=op-done]")).to_have_text("200 events read")
        shot(page, "rebuild-done")

        REBUILDS_MAY_PASS.clear()  # a verify builds a scratch copy the same way: it shows the same
        page.click("[data-testid=verify-test_held]")
        confirm(page, names="went through 200 events")
        verifying = page.locator("[data-testid=ongoing-run][data-kind=verify]")
        expect(verifying.locator("[data-testid=op-total]")).to_have_text("75% of 200 events")
        expect(verifying.locator("[data-testid=op-left]")).to_have_text(time_left)
        REBUILDS_MAY_PASS.set()
        verify = page.locator("[data-testid=projection-run][data-kind=verify]").first
        expect(verify).to_have_attribute("data-status", "completed")
        expect(verify.locator("[data-testid=op-left]")).to_have_text("done")
    finally:
        REBUILDS_MAY_PASS.set()
        context.close()

"""The console in a real browser against the real API and workers: start runs and watch their DAG to the end,
cancel, retry, refresh, rebuild a projection, read the recovery page, see API errors."""

from __future__ import annotations

import json
import re
import threading
import uuid

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from eventstore import NewEvent
from tests.browser.conftest import Console, confirm, shot
from tests.flows import GATES
from tests.projections import POISONED


def start_run(page: Page, workflow: str, input: object = None, key: str = "") -> str:
    """Start a run from the form on the runs page; return its id once the run page shows."""
    page.goto(page.url.split("#")[0] + "#/runs")
    page.wait_for_selector(f"#start-workflow option[value='{workflow}']", state="attached")
    page.select_option("#start-workflow", workflow)
    page.fill("#start-input", "" if input is None else json.dumps(input))
    page.fill("#start-key", key)
    page.click("#start-submit")
    expect(page).to_have_url(re.compile(r"#/runs/[0-9a-f-]{36}$"))
    return page.url.rsplit("/", 1)[1]


def at(locator: Locator) -> tuple[float, float]:
    """Where a DAG node is drawn: its (x, y) translation."""
    x, y = re.findall(r"-?[\d.]+", locator.get_attribute("transform") or "")[:2]
    return float(x), float(y)


def node(page: Page, name: str) -> Locator:
    return page.locator(f"[data-testid='node-{name}']")


def expect_run(page: Page, status: str) -> None:
    expect(page.locator("#run-status")).to_have_attribute("data-status", status)


@pytest.mark.parametrize(
    ("workflow", "nodes", "input"),
    [
        ("linear", ["first", "second", "third"], {"n": 3}),
        ("diamond", ["source", "left", "right", "join"], None),
        ("resumable", ["items"], None),
    ],
)
def test_a_run_started_from_the_console_is_drawn_to_completion(
    page: Page, workflow: str, nodes: list[str], input: object
) -> None:
    run_id = start_run(page, workflow, input)
    page.wait_for_selector("[data-testid=dag]")
    for name in nodes:
        expect(node(page, name)).to_be_visible()
    expect_run(page, "succeeded")
    for name in nodes:
        expect(node(page, name)).to_have_attribute("data-status", "succeeded")
        expect(node(page, name).locator("[data-testid=node-icon]")).to_have_text("✓")
    expect(page.locator("#run-status")).to_have_text(f"Succeeded ({len(nodes)}/{len(nodes)} nodes complete)")
    # Polling stops with the run; Refresh is offered, Cancel and Retry are not.
    expect(page.locator("#run-status")).to_have_attribute("data-polling", "false")
    expect(page.locator("#run-refresh")).to_be_visible()
    expect(page.locator("#run-cancel")).to_be_hidden()
    expect(page.locator("#run-retry")).to_be_hidden()
    if workflow == "resumable":  # its node maps over ten items, reporting progress as it goes
        expect(node(page, "items").locator("[data-testid=node-count]")).to_have_text("10/10")
    shot(page, f"dag-{workflow}-succeeded")

    if workflow == "diamond":  # layered by depth, top to bottom: source / left beside right / join
        y = {n: at(node(page, n))[1] for n in nodes}
        assert y["source"] < y["left"] == y["right"] < y["join"]
        assert at(node(page, "left"))[0] < at(node(page, "right"))[0]
        expect(page.locator("[data-edge]")).to_have_count(4)

    page.click("nav a[data-nav=runs]")
    row = page.locator(f"[data-testid=run-row][data-run-id='{run_id}']")
    expect(row).to_have_attribute("data-status", "succeeded")  # once the projector has caught up
    expect(row).to_contain_text(f"{len(nodes)}/{len(nodes)}")


def test_a_run_is_cancelled_from_the_console_and_retried(page: Page) -> None:
    run_id = start_run(page, "gated", key=f"gate-{uuid.uuid4().hex[:6]}")
    gate = node(page, "wait_gate")
    expect(gate).to_have_attribute("data-status", "running")
    expect(gate.locator("[data-testid=node-icon]")).to_have_text("▶")
    expect(gate).to_contain_text("waiting at the gate")
    count = gate.locator("[data-testid=node-count]")  # the node's progress, redrawn as the page polls
    expect(count).to_have_text(re.compile(r"^\d+$"))
    expect(count).not_to_have_text(count.text_content() or "")
    expect(page.locator("#run-status")).to_have_text("Running (0/2 nodes complete)")
    expect(page.locator("#run-status")).to_have_attribute("data-polling", "true")
    expect(page.locator("#run-retry")).to_be_hidden()
    shot(page, "dag-gated-running")

    page.click("#run-cancel")
    confirm(page, names="Cancel gated run")
    expect_run(page, "cancelled")
    expect(gate).to_have_attribute("data-status", "cancelled")
    expect(gate.locator("[data-testid=node-icon]")).to_have_text("⊘")
    expect(node(page, "after_gate")).to_have_attribute("data-status", "pending")
    expect(page.locator("#run-status")).to_have_attribute("data-polling", "false")
    expect(page.locator("#run-cancel")).to_be_hidden()
    shot(page, "dag-gated-cancelled")

    GATES.setdefault(run_id, threading.Event()).set()  # the retried attempt goes through
    page.click("#run-retry")
    confirm(page, names="Retry gated run")
    expect_run(page, "succeeded")
    expect(node(page, "after_gate")).to_have_attribute("data-status", "succeeded")


def test_a_failed_run_is_retried_from_the_console(page: Page) -> None:
    start_run(page, "flaky", {"fail_times": 3})
    expect_run(page, "failed")
    flaky = node(page, "flaky")
    expect(flaky).to_have_attribute("data-status", "failed")
    expect(flaky.locator("[data-testid=node-icon]")).to_have_text("✗")
    expect(flaky).to_contain_text("#3")  # three attempts, all failed
    expect(page.locator("#run-error")).to_be_visible()
    expect(page.locator("#run-retry")).to_be_visible()
    shot(page, "dag-flaky-failed")

    page.click("#run-retry")
    confirm(page, names="its flaky node")
    expect_run(page, "succeeded")
    expect(flaky).to_contain_text("#4")
    expect(node(page, "after_flaky")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("#run-retry")).to_be_hidden()


def test_a_succeeded_run_is_refreshed_with_new_input(page: Page) -> None:
    start_run(page, "linear", {"n": 1})
    expect_run(page, "succeeded")
    expect(page.locator("#refresh-input")).to_have_value('{"n":1}')  # the run's input, to edit
    page.fill("#refresh-input", json.dumps({"n": 5}))
    page.click("#run-refresh")
    confirm(page, names='Input: {"n":5}')
    expect(page.locator("[data-testid=notice]")).to_have_text("re-running first, second, third")
    for name in ("first", "second", "third"):  # new input: every node runs again, as attempt 2
        expect(node(page, name)).to_contain_text("#2")
        expect(node(page, name)).to_have_attribute("data-status", "succeeded")
    expect_run(page, "succeeded")


def test_a_projection_rebuild_appears_in_its_runs_history(page: Page, console: Console) -> None:
    start_run(page, "linear")  # something in the log for the projections to hold
    expect_run(page, "succeeded")
    page.click("nav a[data-nav=projections]")
    row = page.locator("[data-testid=projection-row][data-name=workflow_tables]")
    expect(row).to_be_visible()
    expect(page.locator("#horizon")).to_contain_text("age")
    page.click("[data-testid=rebuild-workflow_tables]")
    confirm(page, names="Rebuild workflow_tables")
    expect(page).to_have_url(re.compile(r"#/projections/workflow_tables$"))
    expect(page.locator("[data-testid=notice]")).to_contain_text("rebuild of workflow_tables requested")
    rebuild = page.locator("[data-testid=projection-run][data-kind=rebuild]")
    expect(rebuild.first).to_be_visible()
    expect(rebuild.first).to_have_attribute("data-status", "completed")
    expect(page.locator("#projection-failures")).to_contain_text("none")
    shot(page, "projections-rebuilt")

    page.click("[data-testid=verify-workflow_tables]")
    confirm(page, names="Verify workflow_tables")
    expect(page.locator("[data-testid=projection-run][data-kind=verify]").first).to_be_visible()


def test_projection_failures_are_skipped_and_retried_from_the_console(page: Page, console: Console) -> None:
    page.goto(page.url.split("#")[0] + "#/projections/test_counter")
    row = page.locator("[data-testid=projection-row][data-name=test_counter]")
    expect(row).to_have_attribute("data-state", "running")
    failure = page.locator("#projection-failures [data-testid=failure-row]")

    POISONED.add("p1")  # the counter's handler fails on this event: a failure record blocks the projection
    console.services.store.append("acct-1", [NewEvent("Add", {"poison": "p1"})])
    expect(failure).to_have_count(1)
    expect(failure).to_contain_text("poisoned event p1")
    expect(row).to_have_attribute("data-state", "blocked")
    expect(row.locator("[data-testid=open-failures]")).to_have_text("1")
    shot(page, "projection-failure")
    failure.locator("button", has_text="Skip").click()
    confirm(page, names="never applied to test_counter")
    expect(page.locator("[data-testid=notice]")).to_contain_text("skip of failure")
    expect(failure).to_have_count(0)
    expect(row).to_have_attribute("data-state", "running")

    POISONED.add("p2")
    console.services.store.append("acct-1", [NewEvent("Add", {"poison": "p2"})])
    expect(failure).to_have_count(1)
    POISONED.clear()  # "fixed the handler": the retried event applies
    failure.locator("button", has_text="Retry").click()
    confirm(page, names="applies the Add event")
    expect(failure).to_have_count(0)
    expect(row.locator("[data-testid=open-failures]")).to_have_text("0")


def test_the_recovery_page_shows_the_queue(page: Page) -> None:
    page.click("nav a[data-nav=recovery]")
    for count in ("ready", "running", "orphaned", "parked"):
        expect(page.locator(f"[data-testid=queue-{count}] .count")).to_have_text(re.compile(r"^\d+$"))
    expect(page.locator("#recoveries-table")).to_be_visible()
    shot(page, "recovery")


def test_api_errors_show_in_the_banner(page: Page) -> None:
    page.goto(page.url.split("#")[0] + f"#/runs/{uuid.uuid4()}")
    banner = page.locator("[data-testid=banner]")
    expect(banner).to_have_attribute("data-kind", "error")
    expect(page.locator("[data-testid=error-code]")).to_have_text(re.compile(r"\w"))
    expect(page.locator("[data-testid=error-message]")).to_have_text(re.compile(r"\w"))
    shot(page, "error-banner-unknown-run")

    page.click("nav a[data-nav=runs]")
    expect(banner).to_be_hidden()
    page.fill("#token-input", "not-a-token")
    page.click("#token-save")
    expect(banner).to_have_attribute("data-kind", "error")
    expect(page.locator("[data-testid=error-message]")).to_contain_text("malformed")
    expect(page.locator("[data-testid=error-next]")).to_be_visible()


def test_a_busy_server_does_not_stop_the_page_following_its_run(page: Page) -> None:
    """A 429 (the tenant's line of requests was full) asks to come back, unlike other refusals: the run page
    polls on, and shows the run's end."""
    run_id = start_run(page, "gated")
    expect(node(page, "wait_gate")).to_have_attribute("data-status", "running")
    refused: list[str] = []

    def busy(route: Route) -> None:
        if refused:
            route.continue_()
            return
        refused.append(route.request.url)
        route.fulfill(
            status=429,
            headers={"Retry-After": "1"},
            json={"error": {"code": "too_many_requests", "message": "busy", "next": "retry"}},
        )

    with page.expect_response(lambda r: r.status == 429):
        page.route(re.compile(rf"/api/v1/runs/{run_id}$"), busy)
    GATES.setdefault(run_id, threading.Event()).set()
    expect_run(page, "succeeded")
    expect(page.locator("#run-status")).to_have_attribute("data-polling", "false")

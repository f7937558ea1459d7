"""The console's runs page finds runs by tags and pages through them; a run's page shows its history: a
timeline of its events and a Gantt of its node attempts, retries included (real browser, API, worker)."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.browser.conftest import Console, shot
from tests.browser.test_console import expect_run


def start_tagged(page: Page, workflow: str, tags: str, input: str = "") -> str:
    page.goto(page.url.split("#")[0] + "#/runs")
    page.wait_for_selector(f"#start-workflow option[value='{workflow}']", state="attached")
    page.select_option("#start-workflow", workflow)
    page.fill("#start-input", input)
    page.fill("#start-tags", tags)
    page.click("#start-submit")
    expect(page).to_have_url(re.compile(r"#/runs/[0-9a-f-]{36}$"))
    return page.url.rsplit("/", 1)[1]


def test_runs_are_found_by_tag_and_paged(page: Page, console: Console) -> None:
    red = [start_tagged(page, "linear", "team=red n=" + str(i), '{"n": 1}') for i in range(3)]
    blue = start_tagged(page, "linear", "team=blue", '{"n": 1}')
    page.goto(page.url.split("#")[0] + "#/runs")
    # The list reads the run tables, a moment behind the starts: once the last run started is listed, so
    # are the others (a page read before would change under the test as the list refreshes).
    expect(page.locator(f"[data-testid=run-row][data-run-id='{blue}']")).to_have_count(1)
    page.fill("#filter-tags", "team=red")
    page.fill("#filter-limit", "2")
    page.click("#runs-filter button[type=submit]")
    rows = page.locator("[data-testid=run-row]")
    expect(rows).to_have_count(2)
    first_page = set(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)"))
    expect(page.locator("#runs-next")).to_be_enabled()
    page.click("#runs-next")
    expect(rows).to_have_count(1)
    second_page = set(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)"))
    assert first_page | second_page == set(red)
    assert blue not in first_page | second_page
    expect(page.locator("#runs-next")).to_be_disabled()
    expect(page.locator("[data-testid=run-tags]").first).to_contain_text("team=red")
    shot(page, "runs-by-tag")
    page.click("#runs-first")
    expect(rows).to_have_count(2)


def test_a_runs_page_shows_its_timeline_and_its_attempts(page: Page, console: Console) -> None:
    run_id = start_tagged(page, "flaky", "team=red", '{"fail_times": 1}')
    expect_run(page, "succeeded")
    timeline = page.locator("[data-testid=timeline-row]")
    expect(page.locator("[data-testid=timeline-row][data-type=RunCompleted]")).to_have_count(1)
    expect(timeline.first).to_have_attribute("data-type", "RunStarted")
    expect(timeline.first).to_contain_text("team=red")
    retry = page.locator("[data-testid=timeline-row][data-type=NodeRetryScheduled]")
    expect(retry).to_contain_text("attempt 1 fails on purpose")
    expect(retry).to_contain_text("flaky")
    bars = page.locator("[data-testid=gantt-bar][data-node=flaky]")
    # Attempt 1 (failed, then its back-off), attempt 2 (succeeded).
    expect(bars).to_have_count(3)
    assert bars.evaluate_all("bs => bs.map(b => b.dataset.kind)") == ["attempt", "backoff", "attempt"]
    expect(bars.nth(2)).to_have_class(re.compile(r"o-succeeded"))
    expect(page.locator("[data-testid=gantt-bar][data-node=after_flaky]")).to_have_count(1)
    expect(bars.nth(0).locator("title")).to_contain_text("flaky attempt 1 on browser/")
    history = console.services.store.read_stream(f"wf-{run_id}")
    expect(timeline).to_have_count(len(history))
    shot(page, "run-history")

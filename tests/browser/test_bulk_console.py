"""The runs page's bulk action: over every run the filter keeps, it counts them first (a dry run), asks
with that count, acts only when confirmed, and follows the recorded action to its end (real browser, API,
worker)."""

from __future__ import annotations

import threading
import uuid

from playwright.sync_api import Page, expect

from tests.browser.conftest import Console, confirm, shot
from tests.browser.test_console import node
from tests.browser.test_operator_console import decline, posts
from tests.browser.test_run_search_console import start_tagged
from tests.flows import GATES


def test_a_bulk_pause_asks_with_the_count_then_pauses_exactly_the_filtered_runs(
    page: Page, console: Console
) -> None:
    batch = uuid.uuid4().hex[:6]
    chosen = [start_tagged(page, "gated", f"batch={batch}") for _ in range(3)]
    other = start_tagged(page, "gated", "batch=other")
    expect(node(page, "wait_gate")).to_have_attribute("data-status", "running")
    page.goto(page.url.split("#")[0] + "#/runs")
    page.fill("#filter-tags", f"batch={batch}")
    page.click("#runs-filter button[type=submit]")
    expect(page.locator("[data-testid=run-row]")).to_have_count(3)
    page.select_option("#bulk-kind", "pause")
    sent = posts(page)
    page.click("#bulk-submit")
    decline(page, names="Pause 3 runs?", how="button")
    assert sent == ["/api/v1/runs/bulk/pause"], "only the dry run"
    page.click("#bulk-submit")
    shot(page, "confirm-bulk-pause")
    confirm(page, names="Pause 3 runs")
    progress = page.locator("[data-testid=bulk-progress]")
    expect(progress).to_have_attribute("data-state", "completed")
    expect(progress).to_have_attribute("data-done", "3")
    assert sent == ["/api/v1/runs/bulk/pause"] * 3, "two dry runs and one action"
    engine = console.services.engine
    assert all(engine.load(uuid.UUID(r)).paused for r in chosen)
    assert engine.load(uuid.UUID(other)).status == "running"
    for run_id in (*chosen, other):
        GATES.setdefault(run_id, threading.Event()).set()

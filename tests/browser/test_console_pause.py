"""The run page's Pause and Resume: each asks first, names what it does, and the run shows as paused
until it is resumed."""

from __future__ import annotations

import threading
import uuid

from playwright.sync_api import Page, expect

from tests.browser.conftest import confirm, shot
from tests.browser.test_console import expect_run, node, start_run
from tests.browser.test_operator_console import decline, posts
from tests.flows import GATES


def test_pause_and_resume_from_the_run_page(page: Page) -> None:
    run_id = start_run(page, "gated", key=f"pause-{uuid.uuid4().hex[:6]}")
    sent = posts(page)
    gate = node(page, "wait_gate")
    expect(gate).to_have_attribute("data-status", "running")
    page.click("#run-pause")
    decline(page, names="Keep it running", how="button")
    assert sent == []
    page.click("#run-pause")
    dialog = page.locator("[data-testid=confirm-dialog]")
    expect(dialog).to_contain_text("the running node(s) wait_gate finish")
    shot(page, "confirm-pause-run")
    confirm(page, names="Pause gated run")
    expect_run(page, "paused")
    expect(page.locator("#run-pause")).to_be_hidden()
    GATES.setdefault(run_id, threading.Event()).set()
    expect(gate).to_have_attribute("data-status", "succeeded")
    expect(node(page, "after_gate")).to_have_attribute("data-status", "ready")  # held while paused
    page.click("#run-resume")
    confirm(page, names="Resume gated run")
    expect_run(page, "succeeded")
    assert sent == [f"/api/v1/runs/{run_id}/pause", f"/api/v1/runs/{run_id}/resume"]

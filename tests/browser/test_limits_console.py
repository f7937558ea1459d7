"""The console's limits page in a real browser: each limit's slots in use against its bound, and the nodes
waiting for one."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.api.test_limits import saturate
from tests.browser.conftest import Console, shot


def test_the_limits_page_shows_slots_in_use_and_nodes_waiting(page: Page, console: Console) -> None:
    saturate(console.services)  # a limit of one: one node claimed, two waiting
    page.click("nav a[data-nav=limits]")
    row = page.locator("[data-testid=limit-row][data-limit=llm]")
    expect(row.locator("[data-testid=limit-in-use]")).to_have_text("1 / 1")
    expect(row.locator("[data-testid=limit-waiting]")).to_have_text("2")
    expect(row).to_have_class("limit-full")
    shot(page, "limits")

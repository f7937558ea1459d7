"""A run waiting for a person, in a real browser against the real API and worker: the console says what
the node waits for, an operator approves it with a payload after a confirmation (declining sends
nothing), and the run completes; a token without the operate scope sees the wait and no buttons."""

from __future__ import annotations

import json
import re
import uuid

from playwright.sync_api import Browser, Page, expect

from ops.auth import create_token
from tests.browser.conftest import Console, confirm, shot, sign_in, watch_csp
from tests.browser.test_console import expect_run, node, start_run
from tests.browser.test_operator_console import decline, posts


def test_an_operator_approves_a_waiting_run_and_it_completes(page: Page, console: Console) -> None:
    run_id = start_run(page, "approval")
    review = node(page, "review")
    expect(review).to_have_attribute("data-status", "waiting")
    expect(review.locator("[data-testid=node-icon]")).to_have_text("◷")
    expect(review).to_contain_text("waiting for signal approve")
    expect(page.locator("[data-testid=waiting-review]")).to_have_text("review is waiting for signal approve")
    shot(page, "dag-approval-waiting")

    sent = posts(page)
    page.fill("[data-testid=signal-payload-review]", '{"note": "looks right"}')
    page.click("[data-testid=signal-approve-review]")
    decline(page, names="Approve approval run", how="Escape")
    assert sent == [], "declining sends nothing"

    page.click("[data-testid=signal-approve-review]")
    dialog = page.locator("[data-testid=confirm-dialog]")
    expect(dialog).to_contain_text('Sends signal approve with {"approved":true,"note":"looks right"}')
    confirm(page, names="Node review, which waits for it")
    notice = page.locator("[data-testid=notice]")
    expect(notice).to_contain_text("signal approve sent to node review: approved")
    assert sent == [f"/api/v1/runs/{run_id}/signals/approve"]

    expect_run(page, "succeeded")
    expect(page.locator("[data-testid=waiting]")).to_be_hidden()
    node(page, "publish").click()
    output = page.locator("[data-testid=node-output]")
    expect(output).to_contain_text('"published": true')
    assert json.loads(output.text_content() or "") == {
        "published": True,
        "decision": {"approved": True, "note": "looks right"},
    }
    run = console.services.engine.load(uuid.UUID(run_id))
    assert [s.payload for s in run.signals] == [{"approved": True, "note": "looks right"}]
    shot(page, "dag-approval-approved")


def test_a_payload_that_is_not_an_object_is_refused_before_anything_is_sent(page: Page) -> None:
    start_run(page, "approval")
    expect(node(page, "review")).to_have_attribute("data-status", "waiting")
    sent = posts(page)
    for text, said in (
        ("[1, 2]", "must be a JSON object"),
        ("{oops", "not JSON"),
        ('{"approved": true}', "leave approved out"),
    ):
        page.fill("[data-testid=signal-payload-review]", text)
        page.click("[data-testid=signal-reject-review]")
        expect(page.locator("[data-testid=error-message]")).to_contain_text(said)
        expect(page.locator("[data-testid=confirm-dialog]")).to_be_hidden()
    assert sent == []


def test_a_reader_sees_the_wait_but_no_buttons(browser: Browser, console: Console) -> None:
    _, reader = create_token(console.services.store, tenant="default", scopes=["read"], name="reader")
    run_id = console.services.engine.start("approval").run_id
    context = browser.new_context()
    page = context.new_page()
    violations = watch_csp(page)
    page.goto(console.url + "/console/#/runs")
    sign_in(page, reader)
    page.goto(f"{console.url}/console/#/runs/{run_id}")
    expect(node(page, "review")).to_have_attribute("data-status", "waiting")
    expect(page.locator("[data-testid=waiting-review]")).to_contain_text("waiting for signal approve")
    expect(page.locator("[data-testid=signal-approve-review]")).to_have_count(0)
    expect(page.locator("[data-testid=signal-reject-review]")).to_have_count(0)
    expect(page.locator("#page")).not_to_contain_text(re.compile("Approve|Reject"))
    context.close()
    assert violations == []

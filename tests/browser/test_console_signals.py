"""A run waiting for a person, in a real browser against the real API and worker: the console says what
the node waits for, an operator approves it with a payload after a confirmation (declining sends
nothing), and the run completes; a token without the operate scope sees the wait and no buttons (nor
Cancel, Retry or Refresh)."""

from __future__ import annotations

import json
import re
import threading
import uuid

from playwright.sync_api import Browser, Page, Route, expect

from ops.auth import create_token
from tests.browser.conftest import Console, confirm, shot, sign_in, watch_csp
from tests.browser.test_console import expect_run, node, start_run
from tests.browser.test_operator_console import decline, posts
from tests.flows import GATES


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
    expect(notice).to_contain_text("signal approve sent for node review: approved")
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
    engine = console.services.engine
    run = engine.load(uuid.UUID(run_id))
    assert [engine.signal_payload(run, i) for i in range(len(run.signals))] == [
        {"approved": True, "note": "looks right"}
    ]
    shot(page, "dag-approval-approved")


def test_pressing_again_after_a_lost_answer_records_the_decision_once(page: Page, console: Console) -> None:
    run_id = start_run(page, "approval", {"hold": True})  # publish holds the run open until told
    expect(node(page, "review")).to_have_attribute("data-status", "waiting")
    # The page keeps seeing the run as it is now (waiting), as if its polls were slow to tell it otherwise.
    seen: dict[str, str] = {}

    def as_first_seen(route: Route) -> None:
        seen.setdefault("body", route.fetch().text())
        route.fulfill(status=200, content_type="application/json", body=seen["body"])

    run_detail = re.compile(rf"/api/v1/runs/{run_id}$")
    page.route(run_detail, as_first_seen)
    # The answer kept is the first poll's after this point: wait for it, so that it is the run before the
    # signal (a loaded machine once had the first poll come after, and the kept answer had no button).
    with page.expect_response(run_detail):
        pass
    kept = {n["name"]: n["status"] for n in json.loads(seen["body"])["nodes"]}
    assert kept["review"] == "waiting"
    keys: list[str | None] = []

    def lose_the_first_answer(route: Route) -> None:
        keys.append(route.request.headers.get("idempotency-key"))
        if len(keys) == 1:
            route.fetch()  # the server records the signal...
            route.abort("connectionreset")  # ...and its answer never reaches the page
        else:
            route.continue_()

    page.route(re.compile(r"/api/v1/runs/[^/]+/signals/approve$"), lose_the_first_answer)
    page.click("[data-testid=signal-approve-review]")
    confirm(page, names="Approve approval run")
    expect(page.locator("[data-testid=error-code]")).to_have_text("unreachable")

    page.click("[data-testid=signal-approve-review]")  # the operator, seeing the error, presses again
    confirm(page, names="Approve approval run")
    expect(page.locator("[data-testid=notice]")).to_contain_text("signal approve was already recorded")
    assert len(keys) == 2
    assert keys[0] is not None
    assert keys[0] == keys[1], "the second press sends the first one's Idempotency-Key"
    page.unroute(run_detail)
    expect(node(page, "publish")).to_have_attribute("data-status", "running")
    GATES.setdefault(f"publish:{run_id}", threading.Event()).set()
    expect_run(page, "succeeded")
    assert len(console.services.engine.load(uuid.UUID(run_id)).signals) == 1


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
    expect(page.locator("#run-cancel")).to_be_hidden()  # nor any other lever it may not pull
    context.close()
    assert violations == []

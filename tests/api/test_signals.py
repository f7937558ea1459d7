"""Signals over HTTP: `POST /api/v1/runs/{id}/signals/{name}` wakes the node that waits for it; a repeat
with one Idempotency-Key is recorded once, also when both arrive at once; other tenants' runs are not
found; bad input and ended runs are refused with a JSON body and leave the log as it was."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ops.services import Services
from tests.api.helpers import Headers, MakeToken, event_count
from tests.waiting import wait_until
from workflows import WorkerSettings, WorkflowWorker
from workflows import events as ev
from workflows.testing import running_worker


@pytest.fixture
def worker(services: Services) -> Iterator[WorkflowWorker]:
    with running_worker(
        services.engine,
        services.registry,
        WorkerSettings(
            concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.05, shutdown_grace=1
        ),
        name="api-signal-worker",
    ) as w:
        yield w


def start(client: TestClient, headers: Headers, **body: Any) -> str:
    response = client.post("/api/v1/workflows/approval/runs", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["run_id"])


def detail(client: TestClient, headers: Headers, run_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/runs/{run_id}", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def node(client: TestClient, headers: Headers, run_id: str, name: str) -> dict[str, Any]:
    return next(n for n in detail(client, headers, run_id)["nodes"] if n["name"] == name)


def signal(
    client: TestClient, headers: Headers, run_id: str, payload: Any = None, name: str = "approve", **kw: Any
) -> Any:  # the TestClient's response (its httpx may be httpx2)
    return client.post(f"/api/v1/runs/{run_id}/signals/{name}", json=payload, headers=headers, **kw)


def signals_recorded(services: Services, run_id: str) -> list[Any]:
    events = services.store.read_stream(ev.run_stream(uuid.UUID(run_id)), tenant="acme")
    return [e.data["payload"] for e in events if e.type == ev.SIGNAL_RECEIVED]


def test_a_signal_wakes_the_waiting_node_and_the_run_completes(
    client: TestClient, admin: Headers, worker: WorkflowWorker
) -> None:
    run_id = start(client, admin)
    review = wait_until(
        lambda: (n := node(client, admin, run_id, "review"))["status"] == "waiting" and n,
        what="the review node to wait",
    )
    assert review["waiting_for"] == "approve"
    assert review["wake_at"] is None, "no timeout: it waits until the signal comes"
    assert detail(client, admin, run_id)["may_operate"] is True

    sent = signal(client, admin, run_id, {"approved": True, "by": "ann"})
    assert sent.status_code == 201, sent.text
    assert sent.json()["duplicate"] is False
    assert sent.json()["name"] == "approve"
    wait_until(lambda: detail(client, admin, run_id)["status"] == "succeeded", what="the run to complete")
    published = client.get(f"/api/v1/runs/{run_id}/nodes/publish", headers=admin).json()
    assert published["output"] == {"published": True, "decision": {"approved": True, "by": "ann"}}
    assert published["waiting_for"] is None


def test_a_wait_with_a_timeout_shows_until_when(
    client: TestClient, admin: Headers, worker: WorkflowWorker
) -> None:
    run_id = start(client, admin, input={"timeout": 3600})
    review = wait_until(
        lambda: (n := node(client, admin, run_id, "review"))["status"] == "waiting" and n,
        what="the review node to wait",
    )
    assert review["waiting_for"] == "approve"
    assert review["wake_at"] is not None


def test_a_signal_sent_before_the_node_waits_is_kept(
    client: TestClient, admin: Headers, services: Services
) -> None:
    run_id = start(client, admin)  # no worker: the draft node has not even run
    assert signal(client, admin, run_id, {"approved": False}).status_code == 201
    assert signals_recorded(services, run_id) == [{"approved": False}]


def test_one_idempotency_key_twice_at_once_records_one_signal(
    client: TestClient, admin: Headers, services: Services
) -> None:
    run_id = start(client, admin)
    keyed = {**admin, "Idempotency-Key": "decision-1"}
    barrier = threading.Barrier(2, timeout=60)
    answers: list[Any] = []

    def send() -> None:
        barrier.wait()
        answers.append(signal(client, keyed, run_id, {"approved": True}))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(a.status_code for a in answers) == [200, 201]
    first, repeat = sorted(answers, key=lambda a: a.status_code, reverse=True)
    assert repeat.json() == {**first.json(), "duplicate": True}
    assert signals_recorded(services, run_id) == [{"approved": True}]

    other = signal(client, keyed, run_id, {"approved": False})
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert signals_recorded(services, run_id) == [{"approved": True}]


def test_another_tenants_run_is_not_found(
    client: TestClient, make_token: MakeToken, database_url: str
) -> None:
    run_id = start(client, make_token("admin", tenant="acme"))
    before = event_count(database_url)
    for headers in (make_token("operate", tenant="globex"), make_token("admin", tenant="globex")):
        refused = signal(client, headers, run_id, {"approved": True})
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "not_found"
        assert "acme" not in refused.text, "nothing about the other tenant"
    missing = signal(client, make_token("operate"), str(uuid.uuid4()), {})
    assert missing.status_code == 404
    assert event_count(database_url) == before


def test_signalling_needs_the_operate_scope(client: TestClient, make_token: MakeToken) -> None:
    run_id = start(client, make_token("admin"))
    for scope in ("read", "append"):
        refused = signal(client, make_token(scope), run_id, {"approved": True})
        assert refused.status_code == 403
        assert refused.json()["error"]["details"]["required_any_of"] == ["operate"]
    assert detail(client, make_token("read"), run_id)["may_operate"] is False
    assert detail(client, make_token("read", "operate"), run_id)["may_operate"] is True
    assert signal(client, make_token("operate"), run_id, {"approved": True}).status_code == 201


@pytest.mark.parametrize(
    ("name", "content", "headers", "status"),
    [
        ("not%20a%20name", b"{}", {}, 422),
        ("n" * 101, b"{}", {}, 422),
        ("%C3%A9", b"{}", {}, 422),
        ("approve", b'{"x": NaN}', {}, 422),
        ("approve", b"{not json", {}, 422),
        ("approve", b'"\\ud800"', {}, 422),
        ("approve", b"{}", {"Idempotency-Key": "has space"}, 422),
        ("approve", b"{}", {"Idempotency-Key": "k" * 201}, 422),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    client: TestClient,
    admin: Headers,
    database_url: str,
    name: str,
    content: bytes,
    headers: Headers,
    status: int,
) -> None:
    run_id = start(client, admin)
    before = event_count(database_url)
    refused = client.post(
        f"/api/v1/runs/{run_id}/signals/{name}",
        content=content,
        headers={**admin, **headers, "Content-Type": "application/json"},
    )
    assert refused.status_code == status, refused.text
    assert refused.json()["error"]["code"] in {"invalid_input", "invalid_request"}
    assert event_count(database_url) == before


def test_an_ended_run_is_a_conflict(client: TestClient, admin: Headers, database_url: str) -> None:
    run_id = start(client, admin)
    cancelled = client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin)
    assert cancelled.json()["status"] == "cancelled", "no node ran: the run ends at once"
    before = event_count(database_url)
    refused = signal(client, admin, run_id, {"approved": True})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "run_state_conflict"
    assert "ended" in refused.json()["error"]["message"]
    assert event_count(database_url) == before


def test_a_payload_keeps_its_exact_numbers_and_a_missing_body_is_null(
    client: TestClient, admin: Headers, services: Services
) -> None:
    run_id = start(client, admin)
    exact = b'{"amount": 0.1000000000000000055511151231257827, "big": 123456789012345678901234567890}'
    sent = client.post(
        f"/api/v1/runs/{run_id}/signals/approve",
        content=exact,
        headers={**admin, "Content-Type": "application/json"},
    )
    assert sent.status_code == 201, sent.text
    assert client.post(f"/api/v1/runs/{run_id}/signals/approve", headers=admin).status_code == 201
    amount, empty = signals_recorded(services, run_id)
    assert str(amount["amount"]) == "0.1000000000000000055511151231257827"
    assert amount["big"] == 123456789012345678901234567890
    assert empty is None


# A client that lost an answer retries with its key, whenever that is; and any key the API takes works.


def test_a_repeat_after_the_run_ended_returns_the_first_send(client: TestClient, admin: Headers) -> None:
    run_id = start(client, admin)
    keyed = {**admin, "Idempotency-Key": "decision-1"}
    first = signal(client, keyed, run_id, {"approved": True})
    assert first.status_code == 201
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin).json()["status"] == "cancelled"
    again = signal(client, keyed, run_id, {"approved": True})
    assert again.status_code == 200, again.text
    assert again.json() == {**first.json(), "duplicate": True}


def test_an_idempotency_key_of_200_characters_is_taken(client: TestClient, admin: Headers) -> None:
    run_id = start(client, admin)
    sent = signal(client, {**admin, "Idempotency-Key": "k" * 200}, run_id, {"approved": True})
    assert sent.status_code == 201, sent.text

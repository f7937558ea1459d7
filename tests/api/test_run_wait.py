"""`GET /api/v1/runs/{id}/wait`: answered as soon as the run ends (woken by the run table's projector
batch), at once for an ended run, with `ended` false at its timeout; other tenants' runs are not found; a
wait holds no place among its tenant's requests in flight, so many waits of one tenant do not hold up
another tenant's requests."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from ops.api import create_app
from ops.api.settings import ApiSettings
from ops.services import Services
from projector import ProjectorWorker
from tests.api.helpers import Headers, MakeToken
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, workflow_tables
from workflows.testing import running_worker, wait_for_run


def start(client: TestClient, headers: Headers, workflow: str = "linear", **body: Any) -> uuid.UUID:
    response = client.post(f"/api/v1/workflows/{workflow}/runs", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return uuid.UUID(response.json()["run_id"])


def wait(client: TestClient, headers: Headers, run_id: uuid.UUID | str, **params: Any) -> Response:
    return client.get(f"/api/v1/runs/{run_id}/wait", params=params, headers=headers)


@pytest.fixture
def project(services: Services) -> Callable[[], None]:
    """A projector pass over the run tables (its batches notify the server's listener), by one worker for
    the whole test: a second would wait for the first one's lease to run out."""
    worker = ProjectorWorker(services.store, [workflow_tables])
    return worker.run_until_caught_up


def waiting_in(client: TestClient, headers: Headers, run_id: uuid.UUID, n: int = 1) -> list[Future[Response]]:
    """`n` waits for the run (timeout 30 s) sent on threads of their own, each once the one before waits
    (so that none finds its tenant's requests in flight at the cap while the one before reads the run)."""
    waiters = client.app.state.waiters  # type: ignore[attr-defined]
    before = waiters.waiting
    pool = ThreadPoolExecutor(n)
    sent = []
    for i in range(1, n + 1):
        answer = pool.submit(wait, client, headers, run_id, timeout=30)
        sent.append(answer)
        wait_until(
            lambda i=i, a=answer: waiters.waiting == before + i or a.done(), timeout=30, what=f"wait {i}"
        )
        assert not answer.done(), answer.result().text
    pool.shutdown(wait=False)
    return sent


def test_a_run_that_ends_while_waited_for_is_answered_when_its_end_is_projected(
    client: TestClient, admin: Headers, services: Services, project: Callable[[], None]
) -> None:
    project()  # the run table exists: a look finds the run still running
    run_id = start(client, admin)
    in_flight = client.app.state.in_flight  # type: ignore[attr-defined]
    (answer,) = waiting_in(client, admin, run_id)
    assert in_flight.of("acme") == 0  # a waiting request holds no thread: it is not counted in flight
    services.engine.cancel(run_id, tenant="acme", actor="test")  # nothing ran: it ends at once
    assert not answer.done()  # the stream has the end, the run table not yet: nothing announced it
    project()
    # Long before its 30 s ran out: the projector's batch woke it.
    body = answer.result(timeout=20).json()
    assert body["ended"] is True
    assert (body["run_id"], body["status"], body["workflow"]) == (str(run_id), "cancelled", "linear")
    assert body["finished_at"] is not None
    assert body["version"] == services.engine.load(run_id, tenant="acme").version
    assert client.app.state.waiters.waiting == 0  # type: ignore[attr-defined]


def test_an_ended_run_is_answered_at_once_and_a_running_one_at_its_timeout(
    client: TestClient, admin: Headers, services: Services
) -> None:
    ended, running = start(client, admin), start(client, admin)
    services.engine.cancel(ended, tenant="acme", actor="test")
    # No projector has ever run the run tables: an ended run needs none, its stream says it.
    at_once = wait(client, admin, ended, timeout=30)
    assert at_once.status_code == 200, at_once.text
    assert (at_once.json()["ended"], at_once.json()["status"]) == (True, "cancelled")
    for timeout in (0, 0.2):
        timed_out = wait(client, admin, running, timeout=timeout)
        assert timed_out.status_code == 200, timed_out.text
        body = timed_out.json()
        assert (body["ended"], body["status"], body["finished_at"]) == (False, "running", None)
    assert client.app.state.waiters.waiting == 0  # type: ignore[attr-defined]


def test_a_run_of_another_tenant_is_not_found_as_a_missing_one_is(
    client: TestClient, make_token: MakeToken
) -> None:
    acme, other = make_token("read", "append", tenant="acme"), make_token("read", tenant="other")
    run_id, missing = start(client, acme), uuid.uuid4()
    theirs, nobodys = wait(client, other, run_id, timeout=1), wait(client, other, missing, timeout=1)
    assert (theirs.status_code, nobodys.status_code) == (404, 404)
    assert theirs.json()["error"]["code"] == "not_found"
    assert theirs.json() == _with(nobodys.json(), str(missing), str(run_id))
    assert wait(client, acme, run_id, timeout=0).json()["status"] == "running"  # its own tenant sees it


def _with(body: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    error = dict(body["error"])
    error["message"] = error["message"].replace(old, new)
    return {"error": error}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"timeout": -1}, "timeout"),
        ({"timeout": 31}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"timeout": "nan"}, "timeout"),
        ({"timeout": "inf"}, "timeout"),
        ({"follow": "perhaps"}, "follow"),
    ],
)
def test_bad_input_is_a_typed_422(
    client: TestClient, admin: Headers, params: dict[str, Any], field: str
) -> None:
    response = wait(client, admin, uuid.uuid4(), **params)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert [e["loc"] for e in error["details"]["errors"]] == [["query", field]]


def test_a_run_id_that_is_not_one_is_a_typed_422(client: TestClient, admin: Headers) -> None:
    response = wait(client, admin, "run-42", timeout=1)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"]["errors"][0]["loc"] == ["path", "run_id"]


def test_a_run_retried_after_its_end_is_waited_for_again_without_a_loop_on_its_old_row(
    client: TestClient,
    admin: Headers,
    services: Services,
    project: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = start(client, admin)
    services.engine.cancel(run_id, tenant="acme", actor="test")
    project()  # the row shows it cancelled
    services.engine.retry(run_id, tenant="acme", actor="test")  # its stream: running again; its row: not yet
    loads = 0
    load = Engine.load

    def counted(engine: Engine, *args: Any, **kwargs: Any) -> Any:
        nonlocal loads
        loads += 1
        return load(engine, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", counted)
    body = wait(client, admin, run_id, timeout=1).json()
    assert (body["ended"], body["status"]) == (False, "running")
    # The first read, one after the old row woke it, one at the timeout: the old row woke it once only
    # (a wait woken by it again and again would read the stream every round).
    assert loads <= 3, loads
    (answer,) = waiting_in(client, admin, run_id)
    services.engine.cancel(run_id, tenant="acme", actor="test")
    project()
    assert answer.result(timeout=20).json()["status"] == "cancelled"


def test_a_continued_run_is_answered_as_continued_or_followed_to_its_chains_end(
    client: TestClient, admin: Headers, services: Services
) -> None:
    first = start(client, admin, "countdown", input={"n": 1})
    settings = WorkerSettings(concurrency=2, poll_interval=0.05)
    with running_worker(services.engine, services.registry, settings, name="wait-test-worker"):
        last = wait_for_run(services.engine, first, tenant="acme", follow=True)
    itself = wait(client, admin, first, timeout=5).json()
    assert (itself["ended"], itself["status"], itself["continued_as"]) == (
        True,
        "continued",
        str(last.run_id),
    )
    followed = wait(client, admin, first, timeout=5, follow="true").json()
    assert (followed["run_id"], followed["status"]) == (str(last.run_id), "succeeded")
    assert followed["continued_from"] == str(first)


@pytest.fixture
def fair(services: Services) -> Iterator[TestClient]:
    # No line: a request that found its tenant's requests in flight at the cap would be refused at once.
    settings = ApiSettings(
        max_requests_per_tenant=2, max_queued_requests_per_tenant=0, max_projection_waiters_per_tenant=10
    )
    with TestClient(create_app(services, settings=settings)) as c:
        yield c


def test_many_waits_of_one_tenant_leave_another_tenants_requests_their_share(
    fair: TestClient,
    services: Services,
    make_token: MakeToken,
    project: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acme, other = make_token("admin", tenant="acme"), make_token("admin", tenant="other")
    in_flight, waiters = fair.app.state.in_flight, fair.app.state.waiters  # type: ignore[attr-defined]
    project()
    run_id, theirs = start(fair, acme), start(fair, other)
    quiet = _timed(fair, other, theirs)
    # Every read of one of acme's runs notes how many such reads run at once.
    reading, most, lock = 0, 0, threading.Lock()
    load = Engine.load

    def noted(engine: Engine, run: uuid.UUID, *, tenant: str = "default") -> Any:
        nonlocal reading, most
        with lock:
            reading += tenant == "acme"
            most = max(most, reading)
        try:
            return load(engine, run, tenant=tenant)
        finally:
            with lock:
                reading -= tenant == "acme"

    monkeypatch.setattr(Engine, "load", noted)
    # Five times the tenant's cap on requests in flight, and its whole cap on waits.
    answers = waiting_in(fair, acme, run_id, n=10)
    assert (in_flight.of("acme"), in_flight.queued("acme")) == (0, 0)
    assert in_flight.share() == 2  # the waits hold no share: the other tenant finds the whole cap
    busy = _timed(fair, other, theirs)
    # Both of the other tenant's requests were admitted at once (no line: one that waited would be a 429),
    # and so is one more of the waiting tenant's own; its next wait is over its cap on waits.
    for response in (quiet[0], busy[0], fair.get(f"/api/v1/runs/{run_id}", headers=acme)):
        assert response.status_code == 200, response.text
    refused = wait(fair, acme, run_id, timeout=30)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_waiters"
    assert refused.json()["error"]["details"]["setting"] == "LEDGERFLOW_MAX_PROJECTION_WAITERS_PER_TENANT"
    print(f"other tenant's read: {quiet[1] * 1000:.1f} ms alone, {busy[1] * 1000:.1f} ms beside 10 waits")
    most = 0
    services.engine.cancel(run_id, tenant="acme", actor="test")
    project()
    # All ten wake at once; each reads the stream again only with a place among acme's requests in flight
    # (two, no line): the others are refused as any request past the cap is, and asked to come again.
    ended = [a.result(timeout=20) for a in answers]
    codes = sorted((r.status_code, _outcome(r)) for r in ended)
    assert set(codes) <= {(200, "cancelled"), (429, "too_many_requests")}, codes
    assert (200, "cancelled") in codes
    assert 1 <= most <= 2, most  # never more at once than acme's share
    for refused_again in (r for r in ended if r.status_code == 429):  # asked again, as Retry-After says
        assert refused_again.headers["retry-after"] == "1"
        assert wait(fair, acme, run_id, timeout=30).json()["status"] == "cancelled"
    assert (waiters.waiting, in_flight.of("acme")) == (0, 0)


def _outcome(response: Response) -> str:
    body = response.json()
    return str(body["status"]) if response.status_code == 200 else str(body["error"]["code"])


def _timed(client: TestClient, headers: Headers, run_id: uuid.UUID) -> tuple[Response, float]:
    began = time.perf_counter()
    response = client.get(f"/api/v1/runs/{run_id}", headers=headers)
    return response, time.perf_counter() - began


def test_a_wait_whose_client_goes_away_gives_its_place_back(client: TestClient, admin: Headers) -> None:
    run_id = start(client, admin)
    app, portal = client.app, client.portal
    assert portal is not None
    waiters, in_flight = app.state.waiters, app.state.in_flight  # type: ignore[attr-defined]
    gone = portal.call(asyncio.Event)
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    path = f"/api/v1/runs/{run_id}/wait"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"timeout=30",
        "headers": [(b"authorization", admin["Authorization"].encode()), (b"host", b"x")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    request = portal.start_task_soon(app, scope, receive, send)
    wait_until(lambda: waiters.waiting == 1, timeout=30, what="the request to wait")
    portal.call(gone.set)
    request.result(timeout=20)  # long before its 30 s
    assert (waiters.waiting, in_flight.of("acme")) == (0, 0)

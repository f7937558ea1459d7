"""A bulk cancel asked of the API, its server SIGKILLed midway and started again: the new server finds the
action stopped and works it to its end by itself (ops.api.bulk_resume), no operator asking; every matching
run is cancelled exactly once, and no other run is touched.

`LEDGERFLOW_DRILL_BULK_RUNS` sets the count: 1,000 unless told, which proves the same as more in the time a
CI run has; `LEDGERFLOW_DRILL_BULK_RUNS=10000` is the issue's scale (about 11 minutes on a loaded 2-core
machine). The kill comes after a tenth of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventstore import EventStore
from ops.auth import create_token
from projector import ProjectorWorker
from tests.acceptance.serve_process import free_port, healthy, start_serve
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, workflow_tables
from workflows import events as ev

# 10,000 runs started, projected and cancelled took 11 min on a loaded 2-core machine: room beyond the
# drills' usual 15 min.
pytestmark = [pytest.mark.drill, pytest.mark.timeout(1800)]

RUNS = int(os.environ.get("LEDGERFLOW_DRILL_BULK_RUNS", "1000"))
OTHERS = 25


def start_api(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`ledgerflow serve --api` alone: no workflow worker, so the runs stay running until cancelled."""
    return start_serve(url, port, log, "--api", BULK_RESUME_AFTER="1", BULK_MAX_RUNS=str(RUNS))


@pytest.fixture
def client(store: EventStore) -> Iterator[httpx.Client]:
    _, token = create_token(store, tenant="default", scopes=["admin"], name="drill")
    with httpx.Client(
        base_url=f"http://127.0.0.1:{free_port()}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield client


def cancels(store: EventStore) -> dict[str, int]:
    """RunCancelRequested events per run stream, straight from the log."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT stream_id, count(*) FROM ledgerflow.events WHERE event_type = %s GROUP BY stream_id",
            (ev.RUN_CANCEL_REQUESTED,),
        ).fetchall()
    return {stream: count for stream, count in rows}


def action(client: httpx.Client, action_id: str) -> dict[str, Any]:
    answer = client.get(f"/api/v1/runs/bulk/{action_id}")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_an_api_bulk_cancel_killed_midway_is_finished_by_the_restarted_server(
    store: EventStore, client: httpx.Client, tmp_path: Path
) -> None:
    engine = Engine(store, registry)
    chosen = [engine.start("linear", input=None, tags={"batch": "k"}).run_id for _ in range(RUNS)]
    others = [engine.start("linear", input=None, tags={"batch": "keep"}).run_id for _ in range(OTHERS)]
    worker = ProjectorWorker(store, [workflow_tables])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()
    port = client.base_url.port
    assert port is not None
    log = tmp_path / "serve.log"
    server = start_api(store.url, port, log)
    try:
        wait_until(lambda: healthy(client), timeout=60, what="serve to answer")
        dry = client.post("/api/v1/runs/bulk/cancel", json={"tag": ["batch=k"], "dry_run": True})
        assert (dry.status_code, dry.json()["matched"]) == (202, RUNS)
        asked = client.post("/api/v1/runs/bulk/cancel", json={"tag": ["batch=k"]})
        assert asked.status_code == 202, asked.text
        action_id = asked.json()["id"]
        wait_until(
            lambda: action(client, action_id)["done"] >= max(1, RUNS // 10),
            timeout=600,
            what="a tenth of the runs cancelled",
        )
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT state, done + failed + skipped FROM ledgerflow.bulk_actions WHERE id = %s",
            (uuid.UUID(action_id),),
        ).fetchone()
    assert row is not None
    state, processed = row
    assert state == "running", "killed midway"
    assert processed < RUNS, "killed midway"
    print(f"killed after {processed} of {RUNS} runs")

    server = start_api(store.url, port, log)
    try:
        wait_until(lambda: healthy(client), timeout=60, what="serve to answer after the restart")
        ended = wait_until(
            lambda: (a := action(client, action_id))["state"] != "running" and a,
            timeout=840,
            what="the restarted server to finish the action",
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert (ended["state"], ended["matched"], ended["done"], ended["failed"], ended["skipped"]) == (
        "completed",
        RUNS,
        RUNS,
        0,
        0,
    )
    counted = cancels(store)
    assert [counted.get(ev.run_stream(r), 0) for r in chosen] == [1] * RUNS, "each run cancelled once"
    assert sum(counted.values()) == RUNS, "no other run cancelled"
    assert all(engine.load(r).active for r in others)
    resumed = [line for line in log.read_text().splitlines() if "bulk_action_resumed" in line]
    assert resumed, "the restarted server picked the action up by itself"

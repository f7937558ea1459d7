"""`ledgerflow serve` keeps at most LEDGERFLOW_MAX_CONNECTIONS HTTP connections and requests at once: past
it, a new request is answered 503 at once instead of being queued behind the others (a client that opens
connections and sends nothing cannot make the server hold more and more of them); once they close, the
server answers again."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import httpx

from eventstore import EventStore
from tests.acceptance.serve_process import free_port, healthy, start_serve
from tests.waiting import wait_until

LIMIT = 4


def _fresh_status(port: int) -> int:
    """The status of one request on a connection of its own (closed after it)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        return client.get("/api/healthz").status_code


def test_past_its_connection_limit_serve_answers_503_and_recovers(store: EventStore, tmp_path: Path) -> None:
    port = free_port()
    server = start_serve(store.url, port, tmp_path / "serve.log", "--api", MAX_CONNECTIONS=str(LIMIT))
    idle: list[socket.socket] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            wait_until(lambda: healthy(client), timeout=60, what="serve to answer")
        # Connections that send nothing: each counts against the limit while it is open.
        for _ in range(LIMIT - 1):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        wait_until(lambda: _fresh_status(port) == 503, timeout=30, what="a request past the limit refused")
        for s in idle:
            s.close()
        idle.clear()
        wait_until(lambda: _fresh_status(port) == 200, timeout=30, what="the server to answer again")
        # Below the limit nothing is refused: one connection fewer than before.
        for _ in range(LIMIT - 2):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        assert [_fresh_status(port) for _ in range(5)] == [200] * 5
    finally:
        for s in idle:
            s.close()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log, log[-4000:]

"""Hostile reads against a real `ledgerflow serve`: twelve clients at once read pages of 1 MB events, over
and over, while the server's memory (RSS, psutil) and `/api/healthz`'s latency are watched."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped]  # psutil ships no type stubs; types-psutil is not a dependency
import pytest

from eventstore import EventStore, NewEvent
from ops.auth import create_token
from projector import projection_health, stream_catalogue
from tests.acceptance.serve_process import free_port, healthy, start_serve
from tests.waiting import joined, wait_until

# Serial: it watches the server's memory and its health check's latency, after the rest, in its lane.
pytestmark = [pytest.mark.drill, pytest.mark.serial]

EVENTS = 40
READERS = 12
ROUNDS = 3
#: 1 MB of JSON text per event (the default per-event limit), and trivially compressible: PostgreSQL keeps
#: it in a few kB, so a budget counted in stored bytes would let hundreds of them into one page.
PAD = 1024 * 1024 - 200
MiB = 1024 * 1024


def caught_up(store: EventStore) -> bool:
    return all(h.lag_events_head == 0 for h in projection_health(store, [stream_catalogue]))


def _rss(process: psutil.Process) -> int:
    return int(process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True)))


def test_concurrent_reads_of_large_events_keep_memory_bounded_and_healthz_answering(
    store: EventStore, tmp_path: Path
) -> None:
    for i in range(EVENTS):
        store.append(f"big-{i % 4}", [NewEvent("Big", {"i": i, "pad": "x" * PAD})])
    wait_until(lambda: not store.events_beyond_horizon(), what="the events to become readable")
    _, token = create_token(store, tenant="default", scopes=["read"], name="reader")
    port = free_port()
    server = start_serve(store.url, port, tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=base, timeout=10) as probe:
            wait_until(lambda: healthy(probe), timeout=60, what="serve to answer")
        process = psutil.Process(server.pid)
        # Let the projector work through the log first: its pages are part of the baseline.
        wait_until(lambda: caught_up(store), timeout=120, what="the projections to catch up")
        baseline = _rss(process)

        stop = threading.Event()
        peak = [baseline]
        latencies: list[float] = []
        pages: list[int] = []
        errors: list[str] = []

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss(process))
                time.sleep(0.02)

        def health() -> None:
            with httpx.Client(base_url=base, timeout=30) as client:
                while not stop.is_set():
                    began = time.perf_counter()
                    response = client.get("/api/healthz")
                    latencies.append(time.perf_counter() - began)
                    if response.status_code != 200:
                        errors.append(f"healthz {response.status_code}")
                    time.sleep(0.05)

        def read(n: int) -> None:
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                for _ in range(ROUNDS):
                    after = None
                    while True:
                        params: dict[str, str | int] = {"limit": 1000}
                        if after:
                            params["after"] = after
                        response = client.get("/api/v1/events", params=params)
                        if response.status_code != 200:
                            errors.append(f"events {response.status_code}")
                            return
                        page = response.json()
                        pages.append(len(page["events"]))
                        after = page["cursor"]
                        if page["caught_up"]:
                            break
                    response = client.get(f"/api/v1/streams/big-{n % 4}", params={"limit": 1000})
                    pages.append(len(response.json()["events"]))

        watchers = [threading.Thread(target=sample), threading.Thread(target=health)]
        readers = [threading.Thread(target=read, args=(n,)) for n in range(READERS)]
        for t in watchers + readers:
            t.start()
        began = time.perf_counter()
        for t in readers:
            t.join(timeout=600)
        took = time.perf_counter() - began
        stop.set()
        for t in watchers:
            joined(t)
        growth = peak[0] - baseline
        print(
            f"\nbaseline RSS {baseline / MiB:.0f} MiB, peak {peak[0] / MiB:.0f} MiB "
            f"(+{growth / MiB:.0f} MiB); "
            f"healthz max {max(latencies) * 1000:.0f} ms over {len(latencies)} probes; {len(pages)} pages, "
            f"at most {max(pages)} events each; {READERS} readers x {ROUNDS} rounds in {took:.1f}s"
        )
        assert errors == []
        assert sum(pages) >= READERS * ROUNDS * EVENTS  # every reader read the whole log each round
        assert max(pages) <= 6, "a page of 1 MB events stops at the byte budget"
        assert growth < 300 * MiB
        # The health probe is answered while the readers run, not queued behind them (which would take
        # the readers' whole run); the margin holds on a loaded 2-core machine.
        assert max(latencies) < 5.0, f"healthz took {max(latencies):.2f}s"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            log = (tmp_path / "serve.log").read_text(errors="replace").splitlines()[-30:]
            raise AssertionError("serve did not stop within 60 s of SIGTERM:\n" + "\n".join(log)) from None

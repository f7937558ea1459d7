"""A run fattened by signals, read over HTTP by four clients at once against a real `ledgerflow serve`: the
server's memory (RSS, psutil, sampled throughout) grows by less than 50 MB. Loading a run reads its events
without signal payloads (the fold keeps signals by reference), so 30 signals of 720 KB cost a read nothing.
Before, one such read raised the server's peak memory by 140 MB, and four at once by 484 MB."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped]  # psutil ships no type stubs; types-psutil is not a dependency
import pytest

from eventstore import EventStore
from ops.auth import create_token
from tests.acceptance.serve_process import free_port, healthy, start_serve
from tests.acceptance.test_read_memory import _rss
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, RunCaps

# Not serial: it bounds its own server's memory (RSS), which other tests beside it do not change, and times
# nothing. The sampler's 10 ms pace may slip on a busy machine, but the reads it watches slow down with it:
# a peak lasts while an answer is built, and is seen.
pytestmark = pytest.mark.drill

SIGNALS = 30
PAYLOAD = 720 * 1024
READERS = 4
ROUNDS = 3
MiB = 1024 * 1024


def test_concurrent_reads_of_a_run_fattened_by_signals_keep_memory_small(
    store: EventStore, tmp_path: Path
) -> None:
    # The writer's caps are raised for the attack; the server's defaults would refuse such payloads.
    engine = Engine(store, registry, RunCaps(max_signal_bytes=MiB))
    fat = engine.start("approval", tenant="acme").run_id
    small = engine.start("approval", tenant="acme").run_id
    for i in range(SIGNALS):
        engine.signal(fat, "ignored", {"i": i, "pad": "x" * PAYLOAD}, tenant="acme")
    _, token = create_token(store, tenant="acme", scopes=["read"], name="reader")
    port = free_port()
    server = start_serve(store.url, port, tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            wait_until(lambda: healthy(client), timeout=60, what="serve to answer")
            # Warm up the route (imports, pools, caches) on a run that is not fat.
            for _ in range(3):
                assert client.get(f"/api/v1/runs/{small}").status_code == 200
        process = psutil.Process(server.pid)
        baseline = _rss(process)
        stop = threading.Event()
        peak = [baseline]
        sizes: list[int] = []
        errors: list[str] = []

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss(process))
                time.sleep(0.01)

        def read() -> None:
            with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                for _ in range(ROUNDS):
                    response = client.get(f"/api/v1/runs/{fat}")
                    if response.status_code != 200:
                        errors.append(f"{response.status_code} {response.text[:200]}")
                        return
                    sizes.append(len(response.content))

        sampler = threading.Thread(target=sample)
        readers = [threading.Thread(target=read) for _ in range(READERS)]
        sampler.start()
        began = time.perf_counter()
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout=120)
        took = time.perf_counter() - began
        stop.set()
        sampler.join()
        growth = peak[0] - baseline
        print(
            f"\n{SIGNALS} signals x {PAYLOAD // 1024} KB; {READERS} readers x {ROUNDS} reads in {took:.2f}s; "
            f"baseline RSS {baseline / MiB:.0f} MiB, peak {peak[0] / MiB:.0f} MiB (+{growth / MiB:.1f} MiB); "
            f"answers of {max(sizes)} bytes"
        )
        assert errors == []
        assert len(sizes) == READERS * ROUNDS
        assert max(sizes) < 10_000, "the answer is a summary, not the run's history"
        assert growth < 50 * MiB
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

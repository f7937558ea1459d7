"""Tenant A's attacks of the noisy-neighbour drill, run as a process of their own
(`python -m tests.acceptance.noisy_attacks <attack> <json arguments>`), so that the attackers' threads do
not take the measuring client's share of its interpreter (its GIL) and CPU. Prints one JSON line: what the
server answered."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

MiB = 1024 * 1024
BOGUS = "Bearer lf_0123456789abcdef_" + "x" * 43


def _all(threads: list[threading.Thread], timeout: float) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def waiters(base: str, reads: list[tuple[str, str, int]]) -> dict[str, Any]:
    """For each (token, cursor, count): `count` reads waiting 6 s for `cursor`, all at once."""
    answers: list[dict[str, Any]] = []

    def one(client: httpx.Client, who: str, cursor: str) -> None:
        r = client.get("/api/v1/runs", params={"min_cursor": cursor, "wait": 6})
        code = r.json().get("error", {}).get("code") if r.status_code >= 400 else None
        retry_after = r.headers.get("retry-after")
        answers.append({"who": who, "status": r.status_code, "code": code, "retry_after": retry_after})

    clients = [
        httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"})
        for token, _, _ in reads
    ]
    try:
        threads = [
            threading.Thread(target=one, args=(client, token[:6], cursor))
            for client, (token, cursor, count) in zip(clients, reads, strict=True)
            for _ in range(count)
        ]
        _all(threads, 60)
    finally:
        for c in clients:
            c.close()
    return {"answers": answers}


def bodies(base: str, concurrent: int, each: int) -> dict[str, Any]:
    """`concurrent` clients, each sending `each` 2 MiB bodies one after the other with a bogus token."""
    body = b"x" * (2 * MiB)
    statuses: list[int] = []

    def one() -> None:
        with httpx.Client(base_url=base, timeout=30) as c:
            for _ in range(each):
                try:
                    r = c.post(
                        "/api/v1/streams/x/events",
                        content=body,
                        headers={"Authorization": BOGUS, "Content-Type": "application/json"},
                    )
                    statuses.append(r.status_code)
                except httpx.TransportError:
                    statuses.append(0)  # closed before the whole body was sent

    _all([threading.Thread(target=one) for _ in range(concurrent)], 120)
    return {"statuses": statuses}


def huge_head(port: int, size: int) -> bytes:
    """Sends a request whose one header is `size` bytes; what the server answered (b"" if it just closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /api/healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * MiB
        try:
            for _ in range(size // MiB):
                s.sendall(chunk)
            s.sendall(b"\r\n\r\n")
        except OSError:
            pass  # closed on us: what we wanted
        try:
            return s.recv(200)
        except OSError:
            return b""


def heads(port: int, concurrent: int, size: int) -> dict[str, Any]:
    answers: list[str] = []
    threads = [
        threading.Thread(target=lambda: answers.append(huge_head(port, size)[:30].decode("latin-1")))
        for _ in range(concurrent)
    ]
    _all(threads, 120)
    return {"answers": answers}


def fatten(base: str, token: str, senders: int, readers: int, max_signal_bytes: int) -> dict[str, Any]:
    """One run of A's signalled up to its cap with payloads of the largest size allowed, by `senders`
    threads, while `readers` threads read the run (`GET /runs/<id>`) in a loop, and go on reading it as
    often again once it is full. Before: every read folded the whole stream, signal payloads included."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=60, headers=headers) as c:
        run_id = c.post("/api/v1/workflows/approval/runs", json={}).json()["run_id"]
        # The size the cap counts is the payload's JSON: a string of n characters is n + 2 bytes.
        largest = "x" * (max_signal_bytes - 2)
        too_large = c.post(f"/api/v1/runs/{run_id}/signals/s", json=largest + "x").status_code
    sent: Counter[int] = Counter()
    refusals: list[str] = []
    reads: list[float] = []
    read_statuses: Counter[int] = Counter()
    full = threading.Event()

    def send() -> None:
        with httpx.Client(base_url=base, timeout=60, headers=headers) as client:
            while not full.is_set():
                r = client.post(f"/api/v1/runs/{run_id}/signals/s", json=largest)
                sent[r.status_code] += 1
                if r.status_code == 409:
                    refusals.append(r.json()["error"]["code"])
                    full.set()  # the run holds as many signals as it may
                elif r.status_code != 201:
                    full.set()  # something else went wrong: the answers say what

    def read() -> None:
        with httpx.Client(base_url=base, timeout=60, headers=headers) as client:
            after_full = 0
            while after_full < 20:
                began = time.monotonic()
                r = client.get(f"/api/v1/runs/{run_id}")
                reads.append(time.monotonic() - began)
                read_statuses[r.status_code] += 1
                after_full += full.is_set()

    threads = [threading.Thread(target=send) for _ in range(senders)]
    _all(threads + [threading.Thread(target=read) for _ in range(readers)], 600)
    ordered = sorted(reads)
    return {
        "run_id": run_id,
        "too_large": too_large,
        "sent": {str(k): v for k, v in sent.items()},
        "refusals": refusals,
        "reads": {str(k): v for k, v in read_statuses.items()},
        "read_p50": ordered[len(ordered) // 2] if ordered else None,
        "read_max": ordered[-1] if ordered else None,
    }


def backlog(base: str, token: str, runs: int, threads: int) -> dict[str, Any]:
    """`runs` runs of A's started (workflow `linear`), by `threads` clients at once, with no worker running:
    a backlog of `runs` ready first nodes."""
    statuses: Counter[int] = Counter()
    left = iter(range(runs))
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            while True:
                with lock:
                    if next(left, None) is None:
                        return
                statuses[c.post("/api/v1/workflows/linear/runs", json={"input": {"n": 1}}).status_code] += 1

    began = time.monotonic()
    _all([threading.Thread(target=one) for _ in range(threads)], 600)
    return {"statuses": {str(k): v for k, v in statuses.items()}, "seconds": time.monotonic() - began}


ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {
    "waiters": waiters,
    "bodies": bodies,
    "heads": heads,
    "fatten": fatten,
    "backlog": backlog,
}

if __name__ == "__main__":
    print(json.dumps(ATTACKS[sys.argv[1]](**json.loads(sys.argv[2]))), flush=True)

"""Tenant A's attacks of the noisy-neighbour drill, run as a process of their own
(`python -m tests.acceptance.noisy_attacks <attack> <json arguments>`), so that the attackers' threads do
not take the measuring client's share of its interpreter (its GIL) and CPU. Prints one JSON line: what the
server answered."""

from __future__ import annotations

import json
import socket
import sys
import threading
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


ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {"waiters": waiters, "bodies": bodies, "heads": heads}

if __name__ == "__main__":
    print(json.dumps(ATTACKS[sys.argv[1]](**json.loads(sys.argv[2]))), flush=True)

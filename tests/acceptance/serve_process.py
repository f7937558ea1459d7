"""`ledgerflow serve` as a process of its own, for the drills that talk to it over HTTP: a free port to
give it, its start with the settings a drill needs, and whether it answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serve(
    url: str,
    port: int,
    log: Path,
    *roles: str,
    workflows: str = "tests.flows:registry",
    **settings: str,
) -> subprocess.Popen[bytes]:
    """`ledgerflow serve` on `port` with `roles` (none: every role; "--api": the API alone), its JSON log
    appended to `log`. `settings` are LEDGERFLOW_ variables named without the prefix: MAX_CONNECTIONS="4"."""
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": workflows,
        "LEDGERFLOW_LOG_FORMAT": "json",
        **{f"LEDGERFLOW_{name}": value for name, value in settings.items()},
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "serve", *roles, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/api/healthz").status_code == 200
    except httpx.TransportError:
        return False

"""The noisy-neighbour drill on requests: a real `ledgerflow serve --api`, two tenants. While tenant A
attacks from a process of its own (waiting reads up to and past the caps, eight concurrent 2 MiB bodies
with a bogus token, huge request heads), tenant B keeps appending and listing runs. B's p99 stays under
max(3x quiet p99, 250 ms),
`/api/healthz` under 1 s, B sees no 5xx, the server's RSS grows < 200 MB and the database connections stay
within the pool (plus the listener, the health check and the token lookups). Every figure is printed
(`-s`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]  # psutil ships no type stubs
import psycopg
import pytest

from eventstore import EventStore
from ops.auth import create_token
from projector import ProjectorWorker
from tests.acceptance.test_serve_restart import ROOT, free_port, healthy
from tests.waiting import wait_until
from workflows import workflow_tables

# Serial: it measures a tenant's latency, alone, after the rest.
pytestmark = [pytest.mark.drill, pytest.mark.serial]

POOL = 10
#: The server's connections (by application name): its pool, the API's listener, its health check and its
#: token lookups.
SERVER_CONNECTIONS = (
    "ledgerflow-serve",
    "ledgerflow-api-listener",
    "ledgerflow-health",
    "ledgerflow-api-auth",
)
CONNECTIONS_BOUND = POOL + 3
MiB = 1024 * 1024


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class Watch:
    """Samples the server's RSS and the database's connections while it runs."""

    def __init__(self, pid: int, url: str) -> None:
        self.process = psutil.Process(pid)
        self.url = url
        self.peak_rss = self.rss()
        self.peak_connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                self.peak_rss = max(self.peak_rss, self.rss())
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = ANY(%s)",
                    (list(SERVER_CONNECTIONS),),
                ).fetchone()
                self.peak_connections = max(self.peak_connections, int(row[0]) if row else 0)
                self._stop.wait(0.05)

    @contextmanager
    def running(self) -> Iterator[Watch]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(5)


class TenantB:
    """B's appends and run lists, one after the other, with every latency and every status."""

    def __init__(self, client: httpx.Client, probe: httpx.Client) -> None:
        self.client, self.probe = client, probe
        self.appends: list[float] = []
        self.lists: list[float] = []
        self.health: list[float] = []
        self.statuses: list[int] = []

    def _timed(self, into: list[float], call: Callable[[], httpx.Response]) -> None:
        began = time.monotonic()
        response = call()
        into.append(time.monotonic() - began)
        self.statuses.append(response.status_code)

    def round(self, i: int) -> None:
        body = {"events": [{"type": "Noted", "data": {"i": i}}]}
        self._timed(self.appends, lambda: self.client.post(f"/api/v1/streams/b-{i % 7}/events", json=body))
        self._timed(self.lists, lambda: self.client.get("/api/v1/runs"))
        self._timed(self.health, lambda: self.probe.get("/api/healthz"))

    def run_while(self, busy: Callable[[], bool], at_least: int) -> None:
        i = 0
        while i < at_least or busy():
            self.round(i)
            i += 1


def attack(name: str, **arguments: object) -> subprocess.Popen[str]:
    """One of A's attacks, in a process of its own (`noisy_attacks`): its threads never take the measuring
    client's share of this interpreter."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.acceptance.noisy_attacks", name, json.dumps(arguments)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_one_tenant_cannot_stall_or_exhaust_the_api_for_another(store: EventStore, tmp_path: Path) -> None:
    _, token_a = create_token(store, tenant="tenant-a", scopes=["admin"], name="a")
    _, token_b = create_token(store, tenant="tenant-b", scopes=["admin"], name="b")
    port = free_port()
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": store.url,
        "LEDGERFLOW_WORKFLOWS": "tests.flows:registry",
        "LEDGERFLOW_LOG_FORMAT": "json",
        "LEDGERFLOW_POOL_MAX_SIZE": str(POOL),
        "LEDGERFLOW_MAX_PROJECTION_WAITERS": "30",
        "LEDGERFLOW_MAX_PROJECTION_WAITERS_PER_TENANT": "20",
    }
    with (tmp_path / "serve.log").open("ab") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "serve", "--api", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    figures: dict[str, str] = {}
    try:
        with (
            httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token_a}"}) as a,
            httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token_b}"}) as b,
            httpx.Client(base_url=base, timeout=30) as probe,
        ):
            wait_until(lambda: healthy(probe), timeout=60, what="serve to answer")
            # The run tables were projected once and no projector runs: A's reads wait for its new run.
            ProjectorWorker(store, [workflow_tables]).run_until_caught_up()
            cursor_a = a.post("/api/v1/workflows/linear/runs", json={}).json()["cursor"]
            watch = Watch(server.pid, store.url)
            quiet = TenantB(b, probe)
            quiet.run_while(lambda: False, at_least=60)
            quiet_append, quiet_list = p99(quiet.appends), p99(quiet.lists)
            bound_append, bound_list = max(3 * quiet_append, 0.25), max(3 * quiet_list, 0.25)
            figures["quiet"] = (
                f"append p99 {quiet_append * 1000:.0f} ms, list p99 {quiet_list * 1000:.0f} ms, "
                f"healthz max {max(quiet.health) * 1000:.0f} ms"
            )
            baseline = watch.rss()

            _, token_c = create_token(store, tenant="tenant-c", scopes=["admin"], name="c")
            with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token_c}"}) as c:
                cursor_c = c.post("/api/v1/workflows/linear/runs", json={}).json()["cursor"]
            # The attacks of the issue: 40 of A's reads waiting (and 20 of another tenant's, to reach the
            # server's cap), eight concurrent 2 MiB bodies with a bogus token, 64 MiB request heads.
            attacks = {
                "waiters": {"base": base, "reads": [(token_a, cursor_a, 40), (token_c, cursor_c, 20)]},
                "bodies": {"base": base, "concurrent": 8, "each": 6},
                "heads": {"port": port, "concurrent": 4, "size": 64 * MiB},
            }
            failures: list[str] = []
            answers: dict[str, dict[str, Any]] = {}
            with watch.running():
                for name, arguments in attacks.items():
                    attacker = attack(name, **arguments)
                    loud = TenantB(b, probe)
                    loud.run_while(lambda attacker=attacker: attacker.poll() is None, at_least=20)
                    out, _ = attacker.communicate(timeout=120)
                    answers[name] = json.loads(out) if attacker.returncode == 0 and out else {}
                    if not answers[name]:
                        failures.append(f"the {name} attack failed: exit {attacker.returncode}")
                    figures[f"B under {name}"] = (
                        f"append p99 {p99(loud.appends) * 1000:.0f} ms (bound {bound_append * 1000:.0f}), "
                        f"list p99 {p99(loud.lists) * 1000:.0f} ms (bound {bound_list * 1000:.0f}), "
                        f"healthz max {max(loud.health) * 1000:.0f} ms, n={len(loud.appends)}, "
                        f"statuses {sorted(set(loud.statuses))}"
                    )
                    # Every attack runs and is reported before any bound is judged.
                    if any(s >= 500 for s in loud.statuses):
                        failures.append(f"B saw a 5xx under {name}")
                    if max(loud.health) >= 1.0:
                        failures.append(f"healthz took 1 s or more under {name}")
                    if p99(loud.appends) >= bound_append or p99(loud.lists) >= bound_list:
                        failures.append(f"B's p99 passed its bound under {name}")
            waited = answers.get("waiters", {}).get("answers", [])
            kinds = Counter((w["who"], w["status"], w["code"]) for w in waited)
            figures["waiters"] = ", ".join(
                f"{'A' if who == token_a[:6] else 'C'} {status} {code or ''}".strip() + f": {n}"
                for (who, status, code), n in sorted(kinds.items())
            )
            # Each read waited its 6 s (504) within the caps, or was refused at once: 429 with Retry-After
            # for the waiters' caps (A's 20, the server's 30) or the tenant's requests in flight.
            assert len(waited) == 60, figures
            assert all(w["status"] in (504, 429) for w in waited), figures
            assert all(w["retry_after"] == "1" for w in waited if w["status"] == 429), figures
            assert sum(1 for w in waited if w["status"] == 504 and w["who"] == token_a[:6]) <= 20, figures
            assert sum(1 for w in waited if w["status"] == 504) <= 30, figures
            assert any(w["status"] == 504 for w in waited), figures
            refused = answers.get("bodies", {}).get("statuses", [])
            figures["bodies"] = f"{refused.count(401)} answered 401, {refused.count(0)} closed mid-body"
            assert refused, figures
            assert set(refused) <= {401, 0}, figures
            heads = answers.get("heads", {}).get("answers", [])
            figures["heads"] = "; ".join(repr(x) for x in heads)
            assert heads, figures
            assert not any(x.startswith("HTTP/1.1 200") for x in heads), figures
            figures["memory"] = (
                f"RSS {baseline / MiB:.0f} MiB before, peak {watch.peak_rss / MiB:.0f} MiB "
                f"(+{(watch.peak_rss - baseline) / MiB:.0f} MiB)"
            )
            figures["connections"] = f"peak {watch.peak_connections} (bound {CONNECTIONS_BOUND})"
            assert not failures, (failures, figures)
            assert watch.peak_rss - baseline < 200 * MiB, figures
            assert watch.peak_connections <= CONNECTIONS_BOUND, figures
    finally:
        server.terminate()
        server.wait(30)
        for name, text in figures.items():
            print(f"noisy_neighbour {name}: {text}")

"""The noisy-neighbour drill: a real `ledgerflow serve --api`, two tenants. While tenant A attacks from a
process of its own, tenant B keeps appending and listing runs, and B's latency is measured throughout. A's
attacks, one after the other: waiting reads up to and past the caps, eight concurrent 2 MiB bodies with a
bogus token, huge request heads, one run signalled up to its cap with the largest payloads while it is read
in a loop (a fattened run), and 2,000 queued runs (a backlog), which a real `ledgerflow worker` then drains
while B starts runs of its own. Under every attack B's append and list p99 stay under max(3x B's quiet p99
measured just before it, 250 ms), `/api/healthz` and `/api/readyz` under 1 s (the fixed bounds stretched
on an oversubscribed machine: `oversubscribed`), B sees no 5xx, the server's RSS grows < 200 MB and the
database connections stay within the pool (plus the listener, the health check and the token lookups);
during the drain B's start-to-first-node p99 stays under FIRST_NODE_BOUND. Every figure is printed (`-s`),
with the load average."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]  # psutil ships no type stubs
import psycopg
import pytest

from eventstore import EventStore
from ops.auth import create_token
from projector import ProjectorWorker
from tests.acceptance.drill_workers import db_now, start_worker
from tests.acceptance.serve_process import ROOT, free_port, healthy, start_serve
from tests.async_flows import create_calls_table
from tests.waiting import wait_until
from workflows import run_stream, workflow_tables

# Serial: it measures a tenant's latency, after the rest, in its lane.
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
#: The run caps the fattened run meets, set on the server and named so the attack knows them: the largest
#: signal the product allows by default, and 300 of them a run (the default is 1,000). 300 of 64 KiB are
#: 19 MiB of JSON: a server that folded them at every read would pass the RSS bound twice over with four
#: readers (21 MB of payloads read by four cost +484 MB), and the run fills in a third of the time.
MAX_SIGNALS_PER_RUN = 300
MAX_SIGNAL_BYTES = 64 * 1024
#: A's backlog, and the bound on B's start-to-first-node (its p99) while a worker drains it. 2 s is the
#: issue's: a claim cycle, with room for a loaded 2-core machine. With claims in ready order across tenants
#: (before migration 0028) B's first node waited behind every node of A's that was ready before it: the
#: drill measures how many that was and A's claim rate, and fails unless that wait would have been over
#: the bound (see `test_..._for_another`), so a return of the old order cannot pass it.
BACKLOG = 2000
FIRST_NODE_BOUND = 2.0
#: B's runs started while A's backlog drains, one after the other, each once the one before it has started.
B_STARTS = 15


def p50(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2] if samples else 0.0


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

    def cpu(self) -> float:
        """The server's CPU seconds so far (user and system, its threads together)."""
        times = self.process.cpu_times()
        return float(times.user + times.system)

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
        self.ready: list[float] = []
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
        self._timed(self.ready, lambda: self.probe.get("/api/readyz"))

    def figures(self) -> str:
        return (
            f"append p50 {p50(self.appends) * 1000:.0f} p99 {p99(self.appends) * 1000:.0f} ms, "
            f"list p50 {p50(self.lists) * 1000:.0f} p99 {p99(self.lists) * 1000:.0f} ms, "
            f"healthz max {max(self.health) * 1000:.0f} ms, readyz max {max(self.ready) * 1000:.0f} ms, "
            f"n={len(self.appends)}, statuses {sorted(set(self.statuses))}, load {load()}"
        )

    def run_while(self, busy: Callable[[], bool], at_least: int) -> None:
        i = 0
        while i < at_least or busy():
            self.round(i)
            i += 1


#: The issue's bounds on B under attack, on a machine whose cores are not oversubscribed.
B_FLOOR = 0.25
PROBE_BOUND = 1.0
#: The most the bounds stretch on a shared machine (see `oversubscribed`).
MOST_STRETCH = 8.0


def oversubscribed() -> float:
    """How many times over the machine's cores are asked for (the 1-minute load average per core, at least
    1, at most MOST_STRETCH): B's fixed bounds stretch by it. A machine shared with other work (other test
    runs) gives B's requests a fraction of a core whatever A does; the drill alone (server, attacker,
    PostgreSQL, B) keeps a 2-core machine near 1-2x. Even at the most stretch (B's floor 2 s, the probes'
    8 s) each isolation the issue found broken fails the drill: 40 waiting reads made every request wait
    16.95 s (past any stretch; and the waiters' 429s are counted); eight 2 MiB bodies read before the token
    cost ~450 MiB and a 64 MiB head was answered 200 (the RSS bound and the heads' answers, which no load
    stretches); a read of a fattened run folded every payload, +484 MB for four reads of 21 MB (the RSS
    bound); B's first node waited for A's whole backlog (FIRST_NODE_BOUND, checked against the backlog's
    depth, not stretched)."""
    return min(MOST_STRETCH, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f} on {os.cpu_count()} cores"


def a_ready(conn: psycopg.Connection[Any]) -> int:
    """A's nodes ready and waiting for a worker."""
    row = conn.execute(
        "SELECT count(*) FROM ledgerflow.workflow_queue WHERE tenant = 'tenant-a' AND status = 'ready'"
    ).fetchone()
    return int(row[0]) if row else 0


def first_node_delay(conn: psycopg.Connection[Any], run_id: str) -> float | None:
    """Seconds from B's run's start to its first node's claim, by the log's own clock; None before."""
    row = conn.execute(
        "SELECT extract(epoch FROM min(recorded_at) FILTER (WHERE event_type = 'wf.NodeClaimed') "
        "  - min(recorded_at) FILTER (WHERE event_type = 'wf.RunStarted')) "
        "FROM ledgerflow.events WHERE tenant = 'tenant-b' AND stream_id = %s",
        (run_stream(uuid.UUID(run_id)),),
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def a_claim_rate(conn: psycopg.Connection[Any], since: datetime) -> float:
    """A's nodes claimed per second since `since` (the drain's start), from its first claim to its last."""
    row = conn.execute(
        "SELECT count(*) - 1, extract(epoch FROM max(recorded_at) - min(recorded_at)) FROM ledgerflow.events "
        "WHERE tenant = 'tenant-a' AND event_type = 'wf.NodeClaimed' AND recorded_at >= %s",
        (since,),
    ).fetchone()
    if row is None or not row[0] or not row[1]:
        return 0.0
    return float(row[0]) / float(row[1])


class Drain:
    """B's runs started one after the other while a worker drains A's backlog, between B's rounds: each
    start notes how many of A's nodes were ready before it, and its first node's delay once claimed."""

    def __init__(self, client: httpx.Client, conn: psycopg.Connection[Any], since: datetime) -> None:
        self.client, self.conn, self.since = client, conn, since
        self.delays: list[float] = []
        self.ahead: list[int] = []
        self._pending: str | None = None
        self._working = False

    def busy(self) -> bool:
        if not self._working:  # B's first start waits for the worker's first claim, not its start-up
            self._working = a_claim_rate(self.conn, self.since) > 0
            return True
        if self._pending is not None:
            delay = first_node_delay(self.conn, self._pending)
            if delay is None:
                return True
            self.delays.append(delay)
            self._pending = None
        if len(self.delays) >= B_STARTS:
            return False
        ahead = a_ready(self.conn)
        if ahead < BACKLOG // 4:  # the backlog is nearly drained: what follows proves nothing
            return False
        self.ahead.append(ahead)
        r = self.client.post("/api/v1/workflows/linear/runs", json={"input": {"n": 1}})
        assert r.status_code == 201, r.text
        self._pending = str(r.json()["run_id"])
        return True


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
    server = start_serve(
        store.url,
        port,
        tmp_path / "serve.log",
        "--api",
        POOL_MAX_SIZE=str(POOL),
        MAX_PROJECTION_WAITERS="30",
        MAX_PROJECTION_WAITERS_PER_TENANT="20",
        MAX_SIGNALS_PER_RUN=str(MAX_SIGNALS_PER_RUN),
        MAX_SIGNAL_BYTES=str(MAX_SIGNAL_BYTES),
    )
    base = f"http://127.0.0.1:{port}"
    figures: dict[str, str] = {}
    try:
        with (
            httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token_a}"}) as a,
            httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token_b}"}) as b,
            httpx.Client(base_url=base, timeout=30) as probe,
            psycopg.connect(store.url, autocommit=True) as watch_conn,
        ):
            wait_until(lambda: healthy(probe), timeout=60, what="serve to answer")
            # The run tables were projected once and no projector runs: A's reads wait for its new run.
            ProjectorWorker(store, [workflow_tables]).run_until_caught_up()
            cursor_a = a.post("/api/v1/workflows/linear/runs", json={}).json()["cursor"]
            watch = Watch(server.pid, store.url)
            baseline = watch.rss()

            _, token_c = create_token(store, tenant="tenant-c", scopes=["admin"], name="c")
            with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token_c}"}) as c:
                cursor_c = c.post("/api/v1/workflows/linear/runs", json={}).json()["cursor"]
            # The attacks of the issue: 40 of A's reads waiting (and 20 of another tenant's, to reach the
            # server's cap), eight concurrent 2 MiB bodies with a bogus token, 64 MiB request heads.
            # A fattened run: before, a read folded the whole stream with its signal payloads: 300 of
            # 64 KiB (19 MiB of JSON, several times that as Python objects) read by four readers at once
            # would raise the server's RSS far beyond the 200 MB bound (30 of 720 KB by four: +484 MB).
            # A backlog: 2,000 runs queued with no worker, drained below by a worker while B starts runs.
            attacks: dict[str, dict[str, Any]] = {
                "waiters": {"base": base, "reads": [(token_a, cursor_a, 40), (token_c, cursor_c, 20)]},
                "bodies": {"base": base, "concurrent": 8, "each": 6},
                "heads": {"port": port, "concurrent": 4, "size": 64 * MiB},
                "fatten": {
                    "base": base,
                    "token": token_a,
                    "senders": 4,
                    "readers": 4,
                    "max_signal_bytes": MAX_SIGNAL_BYTES,
                },
                "backlog": {"base": base, "token": token_a, "runs": BACKLOG, "threads": 8},
            }
            failures: list[str] = []
            answers: dict[str, dict[str, Any]] = {}

            def quiet(name: str) -> tuple[float, float]:
                """B's bounds for the attack that follows, from its p99 with nothing else of the drill
                running, measured just before: the machine is shared, and its load from outside the drill
                changes over minutes (a baseline from the drill's start would judge that, not A)."""
                alone = TenantB(b, probe)
                cpu, began = watch.cpu(), time.monotonic()
                alone.run_while(lambda: False, at_least=40)
                took = time.monotonic() - began
                figures[f"B quiet before {name}"] = (
                    f"{alone.figures()}, server CPU {(watch.cpu() - cpu) / took:.2f} s/s"
                )
                return p99(alone.appends), p99(alone.lists)

            def judge(name: str, loud: TenantB, quiet_p99: tuple[float, float]) -> None:
                """B's figures under one attack; its failures noted, judged once every attack has run. The
                bounds: the issue's, max(3x quiet p99, 250 ms) and 1 s for the probes, stretched by how
                oversubscribed the shared machine is (`oversubscribed`)."""
                stretch = oversubscribed()
                floor, probes = B_FLOOR * stretch, PROBE_BOUND * stretch
                bound_append, bound_list = (max(3 * q, floor) for q in quiet_p99)
                figures[f"B under {name}"] = (
                    f"{loud.figures()} (bounds {bound_append * 1000:.0f} / {bound_list * 1000:.0f} ms, "
                    f"probes {probes:.1f} s: the issue's stretched {stretch:.1f}x)"
                )
                if any(s >= 500 for s in loud.statuses):
                    failures.append(f"B saw a 5xx under {name}")
                if max(loud.health) >= probes or max(loud.ready) >= probes:
                    failures.append(f"healthz or readyz took {probes:.1f} s or more under {name}")
                if p99(loud.appends) >= bound_append or p99(loud.lists) >= bound_list:
                    failures.append(f"B's p99 passed its bound under {name}")

            with watch.running():
                for name, arguments in attacks.items():
                    bounds = quiet(name)
                    attacker = attack(name, **arguments)
                    loud = TenantB(b, probe)
                    cpu, began = watch.cpu(), time.monotonic()
                    loud.run_while(lambda attacker=attacker: attacker.poll() is None, at_least=20)
                    took = time.monotonic() - began
                    figures[f"server CPU under {name}"] = (
                        f"{(watch.cpu() - cpu) / took:.2f} s/s for {took:.1f} s"
                    )
                    printed, _ = attacker.communicate(timeout=600)
                    answers[name] = json.loads(printed) if attacker.returncode == 0 and printed else {}
                    if not answers[name]:
                        failures.append(f"the {name} attack failed: exit {attacker.returncode}")
                    judge(name, loud, bounds)  # every attack runs and is reported before any is judged
                # The backlog drains: a worker runs, and B starts runs one after the other meanwhile.
                name = "the backlog's drain"
                bounds = quiet(name)
                create_calls_table(store.url)  # the nodes' side table, made once rather than raced for
                drain_began = db_now(store)
                worker = start_worker(store.url, "noisy-worker", tmp_path / "worker.log", lease_ttl=5.0)
                try:
                    drain = Drain(b, watch_conn, drain_began)
                    loud = TenantB(b, probe)
                    loud.run_while(drain.busy, at_least=20)
                    judge(name, loud, bounds)
                    rate = a_claim_rate(watch_conn, drain_began)
                    left = a_ready(watch_conn)
                finally:
                    worker.terminate()
                    worker.wait(30)
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
            fat = answers.get("fatten", {})
            figures["fattened run"] = (
                f"signals {fat.get('sent')}, refused {fat.get('refusals')}, one byte over the largest: "
                f"{fat.get('too_large')}; A's reads {fat.get('reads')}, "
                f"p50 {fat.get('read_p50', 0) * 1000:.0f} ms, max {fat.get('read_max', 0) * 1000:.0f} ms"
            )
            assert fat.get("sent", {}).get("201") == MAX_SIGNALS_PER_RUN, figures
            assert fat.get("refusals"), figures
            assert set(fat["refusals"]) == {"run_signal_limit"}, figures
            assert fat.get("too_large") == 413, figures
            assert set(fat.get("reads", {})) == {"200"}, figures
            queued = answers.get("backlog", {})
            figures["backlog"] = (
                f"A's {BACKLOG} starts {queued.get('statuses')} in {queued.get('seconds', 0):.1f} s; drain: "
                f"A's claims {rate:.0f}/s, {left} of A's nodes still ready at the end"
            )
            ahead_wait = min(drain.ahead, default=0) / rate if rate else 0.0
            figures["B's first node"] = (
                f"start-to-first-node p50 {p50(drain.delays) * 1000:.0f} ms, "
                f"p99 {p99(drain.delays) * 1000:.0f} ms (bound {FIRST_NODE_BOUND:g} s), "
                f"n={len(drain.delays)}; A's ready nodes at B's starts "
                f"{min(drain.ahead, default=0)}..{max(drain.ahead, default=0)}, so in ready order B would "
                f"have waited >= {ahead_wait:.1f} s"
            )
            figures["load"] = f"{load()} at the end"
            assert queued.get("statuses") == {"201": BACKLOG}, figures
            assert len(drain.delays) == B_STARTS, figures
            assert p99(drain.delays) < FIRST_NODE_BOUND, figures
            # The bound proves fairness only if ready order (every tenant's nodes by ready_at) would break
            # it: B's node would have waited for every node of A's ready before it, at A's claim rate.
            assert ahead_wait > 2 * FIRST_NODE_BOUND, figures
            assert not failures, (failures, figures)
            assert watch.peak_rss - baseline < 200 * MiB, figures
            assert watch.peak_connections <= CONNECTIONS_BOUND, figures
    finally:
        server.terminate()
        server.wait(30)
        for name, text in figures.items():
            print(f"noisy_neighbour {name}: {text}")

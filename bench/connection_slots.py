"""The server slots each long-running role holds: at rest, at the peak of a burst, and how long after the
burst it is back at rest.

    python -m bench.connection_slots [--burst-runs 200] [--appenders 8] [--watch 40]

Starts a `ledgerflow worker`, a `ledgerflow projector` and a `ledgerflow serve --api` on a fresh database,
waits until each is at rest, then sends a burst: runs started (`diamond`, which the worker and the projector
then work through) and appends over HTTP from `--appenders` threads at once. Each process's connections are
counted by the server (pg_stat_activity, by the client port each process has open), every 0.25 s, from
before the burst until `--watch` seconds after it ended.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]  # psutil ships no type stubs
import psycopg

from bench._common import default_admin_url, fresh_database, print_table, quiet_logs
from eventstore import open_store
from ops.auth import create_token
from tests.flows import registry
from workflows import Engine

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ports_of(pid: int) -> set[int]:
    """The local ports of `pid`'s TCP connections to the server (port 5432)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.raddr and c.raddr.port == 5432}


def slots(admin: psycopg.Connection[Any], dbname: str, pids: dict[str, int]) -> dict[str, int]:
    """The server's backends of each process (a backend counts once the server has it)."""
    rows = admin.execute(
        "SELECT client_port FROM pg_stat_activity WHERE datname = %s AND client_port IS NOT NULL", (dbname,)
    ).fetchall()
    server_ports = {int(r[0]) for r in rows}
    return {role: len(ports_of(pid) & server_ports) for role, pid in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst-runs", type=int, default=200)
    parser.add_argument("--appenders", type=int, default=8)
    parser.add_argument("--appends", type=int, default=100, help="per appender")
    parser.add_argument("--watch", type=float, default=40.0)
    args = parser.parse_args()
    quiet_logs()
    admin_url = default_admin_url()
    with fresh_database(admin_url, prefix="lf_test_slots") as url:
        store = open_store(url=url)
        _, token = create_token(store, tenant="t", scopes=["admin"], name="bench")
        dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
        port = free_port()
        env = os.environ | {
            "LEDGERFLOW_DATABASE_URL": url,
            "LEDGERFLOW_WORKFLOWS": "tests.flows:registry",
            "LEDGERFLOW_LOG_FORMAT": "json",
            "LEDGERFLOW_WORKER_CONCURRENCY": "8",
        }
        logs = Path(tempfile.mkdtemp(prefix="lf-slots-"))
        commands = {
            "worker": ["worker", "--name", "bench"],
            "projector": ["projector"],
            "serve --api": ["serve", "--api", "--port", str(port)],
        }
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for role, command in commands.items():
            with (logs / f"slots-{role.split()[0]}.log").open("wb") as out:
                procs[role] = subprocess.Popen(
                    [sys.executable, "-m", "ops.cli", *command], cwd=ROOT, env=env, stdout=out, stderr=out
                )
        pids = {role: p.pid for role, p in procs.items()}
        samples: list[tuple[float, dict[str, int]]] = []
        try:
            with (
                psycopg.connect(admin_url, autocommit=True) as admin,
                httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    timeout=30,
                    headers={"Authorization": f"Bearer {token}"},
                ) as client,
            ):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    try:
                        if client.get("/api/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.2)
                time.sleep(5)  # the roles' start-up settles (their first leases, claims)
                at_start = slots(admin, dbname, pids)
                engine = Engine(store, registry)
                stop = threading.Event()

                def sample() -> None:
                    while not stop.is_set():
                        samples.append((time.monotonic(), slots(admin, dbname, pids)))
                        stop.wait(0.25)

                sampler = threading.Thread(target=sample, daemon=True)
                began = time.monotonic()
                sampler.start()

                def appender(i: int) -> None:
                    for k in range(args.appends):
                        client.post(
                            f"/api/v1/streams/s-{i}/events",
                            json={"events": [{"type": "N", "data": {"k": k}}]},
                        )

                appenders = [threading.Thread(target=appender, args=(i,)) for i in range(args.appenders)]
                for t in appenders:
                    t.start()
                runs = [engine.start("diamond", input={}).run_id for _ in range(args.burst_runs)]
                for t in appenders:
                    t.join()
                done: Callable[[], bool] = lambda: all(not engine.load(r).active for r in runs)  # noqa: E731
                while not done():
                    time.sleep(0.2)
                ended = time.monotonic()
                time.sleep(args.watch)
                stop.set()
                sampler.join(5)
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait(30)
            store.close()
    rows = []
    for role in commands:
        during = [s[role] for t, s in samples if began <= t <= ended]
        after = [(t - ended, s[role]) for t, s in samples if t > ended]
        final = after[-1][1] if after else 0
        # The first moment after the burst from which the role held no more than at rest before it.
        rest = at_start[role]
        back = next(
            (round(t, 1) for i, (t, _) in enumerate(after) if all(n <= rest for _, n in after[i:])), None
        )
        rows.append([role, str(at_start[role]), str(max(during, default=0)), str(final), str(back)])
    print(
        f"burst: {args.burst_runs} runs, {args.appenders} x {args.appends} appends; "
        f"took {ended - began:.1f} s; logs in {logs}"
    )
    print_table(["role", "at rest", "busy (peak)", f"{args.watch:g} s after", "back at rest after (s)"], rows)
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""A PostgreSQL cluster of a drill's own, and ledgerflow processes run against it.

Drills that restart, stop or fill their server start a throwaway cluster (initdb, pg_ctl) on a port and
data directory of their own rather than disturb the server every other test shares; `throwaway_cluster`
always stops and removes it. `start` runs a `ledgerflow` command against it, logging JSON to a file of its
own; `stop_all` ends such processes and reports any that would not stop. `retrying` and `once` are the
drill's own client calls while the server is away.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventstore import LedgerflowError
from tests.acceptance.drill_workers import DRILL_SHUTDOWN_GRACE

ROOT = Path(__file__).resolve().parents[2]
#: A cluster's connection slots unless a drill says otherwise (tests/acceptance/test_database_outages.py
#: says why this many).
MAX_CONNECTIONS = 35
RESERVED = 5  # superuser_reserved_connections: the drill's own control connections
#: The role ledgerflow's processes log in as; it owns the `ledgerflow` database, as in a deployment.
WORKER_ROLE = "lf_drill"
LEASE_TTL = 5.0


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A throwaway PostgreSQL cluster; run as the `postgres` OS user when the tests run as root."""

    bin: Path
    root: Path
    port: int = field(default_factory=_free_port)
    max_connections: int = MAX_CONNECTIONS
    reserved: int = RESERVED
    #: More server settings, as `-c name=value` options.
    options: str = ""

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=60)

    def _options(self) -> str:
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            f"-c max_connections={self.max_connections} -c superuser_reserved_connections={self.reserved} "
            f"{self.options}"
        ).strip()

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"
        )

    def pg_ctl(self, action: str, mode: str = "fast") -> None:
        log = str(self.root / "server.log")
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            log,
            "-m",
            mode,
            "-w",
            "-o",
            self._options(),
            action,
        )

    def url(self, user: str = "postgres", dbname: str = "ledgerflow") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def running(self) -> bool:
        try:
            with psycopg.connect(self.url(dbname="postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False


@contextlib.contextmanager
def throwaway_cluster(**settings: Any) -> Iterator[Cluster]:
    """A started cluster with the workers' role and database (`settings`: Cluster's fields); always
    stopped and removed afterwards."""
    pg_bin = _pg_bin()
    if pg_bin is None:
        pytest.skip("no PostgreSQL server binaries in /usr/lib/postgresql to start a throwaway cluster")
    c = Cluster(pg_bin, Path(tempfile.mkdtemp(prefix="lf-outage-")), **settings)
    try:
        c.init()
        c.pg_ctl("start")
        with psycopg.connect(c.url(dbname="postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {WORKER_ROLE} LOGIN")
            conn.execute(f"CREATE DATABASE ledgerflow OWNER {WORKER_ROLE}")
        yield c
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            c.pg_ctl("stop", "immediate")
        shutil.rmtree(c.root, ignore_errors=True)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    #: Outages that happened while this process was alive.
    outages: int = 0

    def events(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    lines.append(parsed)
        return lines


def start(cluster: Cluster, tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> Process:
    more = env or {}
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": cluster.url(WORKER_ROLE),
        "LEDGERFLOW_PROJECTIONS": "tests.projections:counter,workflows:workflow_tables",
        "LEDGERFLOW_WORKFLOWS": "tests.flows:registry",
        "LEDGERFLOW_PROJECTOR_LEASE_TTL": str(LEASE_TTL),
        "LEDGERFLOW_PROJECTOR_HEARTBEAT_INTERVAL": str(LEASE_TTL / 4),
        "LEDGERFLOW_WORKFLOW_LEASE_TTL": str(LEASE_TTL),
        "LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL": str(LEASE_TTL / 4),
        "LEDGERFLOW_RECOVERY_INTERVAL": "0.5",
        "LEDGERFLOW_POOL_MAX_SIZE": "4",
        "LEDGERFLOW_LOG_FORMAT": "json",
        "LEDGERFLOW_WORKER_SHUTDOWN_GRACE": DRILL_SHUTDOWN_GRACE,
        **more,
    }
    log = tmp / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return Process(name, popen, log)


def stop_all(processes: list[Process], timeout: float = 30) -> dict[str, int | str]:
    """SIGTERM to every process still running, and each one's exit code. One that does not exit within
    `timeout` dumps its threads' stacks into its log (SIGUSR1), is killed, and is reported with the end of
    that log: the drill then fails on what kept it, and leaves nothing running behind it."""
    for p in processes:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    codes: dict[str, int | str] = {}
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            codes[p.name] = p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=2)  # time to write the stacks
            p.popen.kill()
            p.popen.wait()
            tail = p.log.read_text(errors="replace")[-6000:]
            codes[p.name] = f"did not exit {timeout:.0f} s after SIGTERM; the end of its log:\n{tail}"
    return codes


def retrying(fn: Callable[[], Any], stop: threading.Event | None = None, timeout: float = 30.0) -> Any:
    """The drill's own client calls, tried again while the server is away, for at most `timeout`
    seconds: a server that never comes back fails the drill instead of hanging it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (LedgerflowError, psycopg.Error) as e:
            if stop is not None and stop.is_set():
                return None
            if time.monotonic() > deadline:
                raise AssertionError(f"the database stayed away for {timeout}s: {e}") from e
            (stop or threading.Event()).wait(0.05)


def once(fn: Callable[[], Any]) -> Any:
    """One try of a client call for `wait_until` to poll: an error while the server is away counts as
    not yet, so the poller's own timeout is what bounds the wait."""
    try:
        return fn()
    except (LedgerflowError, psycopg.Error):
        return None

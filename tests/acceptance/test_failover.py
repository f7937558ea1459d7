"""Failover drill: the primary dies under load; its synchronous standby takes over; nothing is lost.

`ops/failover/start.sh` starts a pg_auto_failover monitor, a primary and a synchronous standby in a
directory and on ports of their own. A `ledgerflow serve --api` process takes appends over HTTP, each
with an Idempotency-Key and retried with it until acknowledged; a `ledgerflow worker` runs workflow runs;
a `ledgerflow projector` keeps the projections. Everything connects with the multi-host URL
(`target_session_attrs=read-write`). Then every process of the primary (its keeper, its postmaster and
its backends) is killed with SIGKILL at once, as when its machine dies, and the monitor promotes the
standby. Afterwards: every acknowledged append is in the log exactly once, and so is every retried one;
every run completes; every projection verifies equal to its rebuild; and every process came back by
itself, without a restart. The drill prints the write outage (kill to the first acknowledged append sent
after it) and the time until every run in flight was progressing again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from eventstore import DatabaseSettings, EventStore, open_store
from eventstore.migrate import migrate
from ops.auth import create_token
from projector import verify
from projector.catalogue import stream_catalogue
from tests.acceptance.pg_cluster import WORKER_ROLE, Process, retrying, start, stop_all
from tests.acceptance.test_database_outages import caught_up, lease_owner
from tests.flows import registry
from tests.projections import counter
from tests.waiting import wait_until
from workflows import Engine, workflow_tables
from workflows.events import run_stream

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "ops" / "failover" / "start.sh"
STOP = ROOT / "ops" / "failover" / "stop.sh"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# Serial: it runs a cluster of its own and times the promotion, after the rest, in its lane.
pytestmark = [pytest.mark.failover, pytest.mark.drill, pytest.mark.serial, pytest.mark.own_servers]
#: HTTP clients appending at once: each has one append in flight when the primary dies.
APPENDERS = 8


def _free_base_port() -> int:
    """A port with the next two free as well: the monitor's and the two nodes'."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base > 65000:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base + 1))
                b.bind(("127.0.0.1", base + 2))
        except OSError:
            continue
        return base
    raise RuntimeError("no three consecutive free ports")


@dataclass
class Failover:
    """A monitor on `base`, nodes node1 and node2 on `base + 1` and `base + 2`, all under `root`."""

    root: Path
    base: int
    log: list[str] = field(default_factory=list)

    def url(self, user: str = "postgres", dbname: str = "ledgerflow") -> str:
        hosts = f"127.0.0.1:{self.base + 1},127.0.0.1:{self.base + 2}"
        return f"postgresql://{user}@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"

    def node_url(self, node: str, user: str = "postgres") -> str:
        """One node alone, whatever its role."""
        return f"postgresql://{user}@127.0.0.1:{self.base + int(node[-1])}/ledgerflow?connect_timeout=2"

    def primary(self) -> str:
        """The node that takes writes now."""
        with psycopg.connect(self.url(), connect_timeout=2) as conn:
            row = conn.execute("SELECT inet_server_port()").fetchone()
        assert row is not None
        return f"node{int(row[0]) - self.base}"

    def kill(self, node: str) -> int:
        """SIGKILL to every process of `node` at once: its pg_autoctl session, postmaster and backends
        (backends run in sessions of their own, so they are found as the postmaster's children)."""
        leader = psutil.Process(int((self.root / f"{node}.pid").read_text()))
        # Stopped first, listed again, then killed: a postmaster that ran on between the listing and its
        # kill could fork a backend the kill missed, and that orphan would keep the node's shared memory,
        # so the node could not start again (seen once under load: the rejoin hung for its 120 s).
        for p in [leader, *leader.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGSTOP)
        doomed = [leader, *leader.children(recursive=True)]
        for p in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(doomed, timeout=10)
        return len(doomed)


@pytest.fixture
def failover(tmp_path: Path) -> Iterator[Failover]:
    if shutil.which("pg_autoctl") is None or not (PG_BIN / "postgres").exists():
        pytest.skip(
            "needs pg_auto_failover and PostgreSQL 15: apt-get install pg-auto-failover-cli "
            "postgresql-15-auto-failover"
        )
    # Not under tmp_path: the nodes run as the `postgres` user when the tests run as root, and every
    # ancestor of their directory must let that user in.
    root = Path(tempfile.mkdtemp(prefix="lf-failover-"))
    os.chmod(root, 0o755)  # noqa: S103 (the nodes' user must enter it; nothing secret is in it)
    cluster = Failover(root, _free_base_port())
    try:
        done = subprocess.run(
            [str(START), str(root), str(cluster.base)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        assert done.stdout.strip().splitlines()[-1].startswith("postgresql://")
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {WORKER_ROLE} LOGIN")
            conn.execute(f"ALTER DATABASE ledgerflow OWNER TO {WORKER_ROLE}")
            conn.execute(f"ALTER SCHEMA public OWNER TO {WORKER_ROLE}")
        with psycopg.connect(cluster.url(WORKER_ROLE), autocommit=True) as conn:
            # The side table where tests.flows records node executions, made before nodes race to.
            conn.execute(
                "CREATE TABLE public.calls (run_id uuid, what text, attempt int, pid int, "
                "at timestamptz DEFAULT clock_timestamp())"
            )
        yield cluster
    finally:
        # stop.sh waits 60 s itself; whatever it leaves is killed below, with the leaders' whole trees.
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run([str(STOP), str(root)], capture_output=True, timeout=70, check=False)
        for pidfile in root.glob("*.pid"):
            with contextlib.suppress(psutil.NoSuchProcess, ValueError):
                leader = psutil.Process(int(pidfile.read_text()))
                _, alive = psutil.wait_procs([leader, *leader.children(recursive=True)], timeout=20)
                for p in alive:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
        for log in root.glob("*.log"):  # kept with the test's other logs, for a failure's post-mortem
            shutil.copy(log, tmp_path / f"cluster-{log.name}")
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Ack:
    key: str
    attempts: int
    status: int
    sent: float  # when the attempt that was acknowledged was sent (monotonic)
    acked: float


@dataclass
class Appender:
    """Appends over HTTP, each append with its own Idempotency-Key, retried with that key until it is
    acknowledged (201, or 200 for a repeat whose first attempt had committed unseen)."""

    client: httpx.Client
    name: str
    stop: threading.Event
    acks: list[Ack] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"{self.name}-{i}"
            attempts = 0
            while True:  # a key started is retried to its end, even after `stop`
                attempts += 1
                sent = time.monotonic()
                try:
                    answer = self.client.post(
                        f"/api/v1/streams/fo-{self.name}-{i % 5}/events",
                        json={"events": [{"type": "Add", "data": {"amount": 1, "key": key}}]},
                        headers={"Idempotency-Key": key},
                    )
                except httpx.TransportError:
                    answer = None
                if answer is not None and answer.status_code in (200, 201):
                    self.acks.append(Ack(key, attempts, answer.status_code, sent, time.monotonic()))
                    break
                if answer is not None and answer.status_code != 503:
                    self.refused.append(f"{key}: {answer.status_code} {answer.text}")
                    break
                threading.Event().wait(0.05)  # the database is away: try the same key again soon
            i += 1


def run_versions(store: EventStore, runs: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    streams = store.read_streams([run_stream(r) for r in runs])
    return {r: len(streams[run_stream(r)]) for r in runs}


def test_primary_killed_under_load_loses_nothing(failover: Failover, tmp_path: Path) -> None:
    began = time.monotonic()
    phases: dict[str, float] = {}  # seconds since `began` at each step, printed at the end

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - began, 1)

    url = failover.url(WORKER_ROLE)
    migrate(url)
    store = open_store(DatabaseSettings(pool_min_size=1, pool_max_size=4), url=url, migrate=False)
    engine = Engine(store, registry)
    _, token = create_token(store, tenant="default", scopes=["admin"], name="failover-drill")
    port = _free_base_port()
    processes: list[Process] = []
    stop = threading.Event()
    appenders: list[Appender] = []
    threads: list[threading.Thread] = []
    clients: list[httpx.Client] = []
    try:
        processes.append(start(failover, tmp_path, "serve", "serve", "--api", "--port", str(port)))
        processes.append(start(failover, tmp_path, "projector", "projector"))
        processes.append(start(failover, tmp_path, "worker", "worker", "--name", "failover-a"))
        wait_until(
            lambda: all(lease_owner(store, p.name) for p in (counter, stream_catalogue, workflow_tables)),
            timeout=30,
            what="the projector to hold every lease",
        )
        for n in range(APPENDERS):
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
            clients.append(client)
            appenders.append(Appender(client, f"a{n}", stop))
        wait_until(lambda: _healthy(clients[0]), timeout=30, what="serve to answer")
        phase("started")
        for a in appenders:
            threads.append(threading.Thread(target=a.run, daemon=True))
            threads[-1].start()
        runs = [engine.start("drill", input={"items": 80}).run_id for _ in range(6)]
        wait_until(
            lambda: sum(v > 3 for v in run_versions(store, runs).values()) >= 4,
            timeout=30,
            what="runs to be under way",
        )
        wait_until(lambda: sum(len(a.acks) for a in appenders) >= 30, timeout=30, what="appends")

        # The kill.
        victim = failover.primary()
        before = run_versions(store, runs)
        phase("kill")
        killed_at = time.monotonic()
        killed = failover.kill(victim)
        dead_at = time.monotonic()  # no request sent from now on can reach the old primary
        in_flight = list(runs)

        def first_ack_after_kill() -> float | None:
            after = [a.acked for ap in appenders for a in ap.acks if a.sent >= dead_at]
            return min(after) if after else None

        wait_until(first_ack_after_kill, timeout=60, what="an append acknowledged by the new primary")
        write_outage = (first_ack_after_kill() or 0) - killed_at

        def every_run_progressing() -> bool:
            now = retrying(lambda: run_versions(store, in_flight))
            states = retrying(lambda: engine.load_many(in_flight))
            return all(now[r] > before[r] or not states[r].active for r in in_flight)

        wait_until(every_run_progressing, timeout=60, what="every run to progress on the new primary")
        runs_progressing = time.monotonic() - killed_at
        phase("recovered")
        assert failover.primary() != victim

        # New work after the failover, then every run to its end.
        runs += [engine.start("diamond", input={}).run_id for _ in range(2)]
        wait_until(lambda: sum(len(a.acks) for a in appenders) >= 200, timeout=30, what="more appends")
        stop.set()
        for t in threads:
            t.join(timeout=60)
        wait_until(
            lambda: all(not s.active for s in engine.load_many(runs).values()), timeout=60, what="every run"
        )
        phase("runs_done")
        target = store.committed_so_far()
        # The log ends with workflow events, which every projection reads: its cursor passes `target`.
        last = engine.start("diamond", input={}).run_id
        runs.append(last)
        wait_until(lambda: not engine.load(last).active, timeout=30, what="the last run")
        try:
            wait_until(lambda: caught_up(store, target), timeout=30, what="every projection")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; target {target}; {_projection_state(store)}") from None

        phase("caught_up")
        # Nothing acknowledged is lost; every key, retried or not, is recorded exactly once.
        refused = [r for a in appenders for r in a.refused]
        assert refused == [], refused
        acks = {a.key: a for ap in appenders for a in ap.acks}
        with store.pool.connection() as conn:
            recorded = dict(
                conn.execute(
                    "SELECT data->>'key', count(*) FROM ledgerflow.events "
                    "WHERE event_type = 'Add' AND stream_id LIKE 'fo-%' GROUP BY 1"
                ).fetchall()
            )
        assert set(recorded) == set(acks), (
            f"lost: {sorted(set(acks) - set(recorded))[:10]}, unacknowledged: "
            f"{sorted(set(recorded) - set(acks))[:10]}"
        )
        twice = {k: n for k, n in recorded.items() if n != 1}
        assert twice == {}, f"appends recorded more than once: {twice}"
        retried = [a for a in acks.values() if a.attempts > 1]
        assert retried, "no append was retried: the kill missed the load"
        # Retries answered as repeats: their first attempt had committed, its answer lost with the primary.
        repeats = sum(a.status == 200 for a in retried)

        for run_id in runs:
            run = engine.load(run_id)
            assert run.status == "succeeded", f"run {run_id} ended {run.status}: {run.error}"
        for projection in (counter, stream_catalogue, workflow_tables):
            result = verify(store, projection)
            assert result.equal, f"{projection.name}: {result.differences}"
        with store.pool.connection() as conn:
            row = conn.execute("SELECT max(times) FROM ledgerflow.applied").fetchone()
        assert row == (1,), "an event was applied twice"

        phase("verified")

        # The dead node comes back as the new primary's standby (ops/failover/start.sh again rewinds it),
        # and holds every append too: the pair is synchronous again.
        rejoined = subprocess.run(
            [str(START), str(failover.root)], capture_output=True, text=True, timeout=120, check=False
        )
        assert rejoined.returncode == 0, f"{rejoined.stdout}\n{rejoined.stderr}"
        with psycopg.connect(failover.node_url(victim), autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)

            def standby_has_every_append() -> bool:
                row = conn.execute(
                    "SELECT count(*) FROM ledgerflow.events "
                    "WHERE event_type = 'Add' AND stream_id LIKE 'fo-%'"
                ).fetchone()
                return row == (len(acks),)

            wait_until(standby_has_every_append, timeout=30, what="the rejoined standby to hold every append")
        phase("rejoined")
        # Every process came back by itself: none exited, each saw the outage end.
        exited = {p.name: p.popen.poll() for p in processes if p.popen.poll() is not None}
        assert exited == {}, f"processes exited: {exited}"
        for p in processes:
            if p.name != "serve":
                wait_until(
                    lambda p=p: '"database_available_again"' in p.log.read_text(),
                    timeout=30,
                    what=f"{p.name} to see the database again",
                )
        worker = next(p for p in processes if p.name == "worker")
        if "workflow_presence_unavailable" in worker.log.read_text():  # its session died with the primary
            wait_until(
                lambda: "workflow_presence_restored" in worker.log.read_text(),
                timeout=30,
                what="the worker to hold its presence again",
            )
    finally:
        stop.set()
        codes = stop_all(processes)
        for client in clients:
            client.close()
        store.close()

    assert codes == {p.name: 0 for p in processes}, codes
    for p in processes:
        text = p.log.read_text(errors="replace")
        assert "Traceback" not in text, f"{p.name} logged a traceback:\n{text[-4000:]}"
        events = p.events()
        assert not [e for e in events if e.get("level") == "error"], f"{p.name} logged errors"
        if p.name != "serve":  # a worker says once that it waits, however many of its parts noticed
            warned = [e for e in events if e.get("event") == "database_unavailable"]
            assert len(warned) == 1, f"{p.name}: {len(warned)} database_unavailable warnings for 1 outage"
    print(
        f"\nfailover: killed {victim} ({killed} processes); write outage {write_outage:.2f}s "
        f"(kill to first acknowledged append); every run progressing after {runs_progressing:.2f}s; "
        f"{len(acks)} appends acknowledged, {len(retried)} retried ({repeats} answered as repeats); "
        f"drill took {time.monotonic() - began:.1f}s (phases at s: {phases})"
    )


def _projection_state(store: EventStore) -> str:
    """What holds the projections back, for a failure's message."""
    with store.pool.connection() as conn:
        cursors = conn.execute("SELECT * FROM ledgerflow.projection_cursors").fetchall()
        head = conn.execute("SELECT max(transaction_id), max(position) FROM ledgerflow.events").fetchone()
        horizon = conn.execute("SELECT pg_current_snapshot()").fetchone()
        running = conn.execute(
            "SELECT pid, backend_xid, backend_xmin, state, left(query, 80) FROM pg_stat_activity "
            "WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL"
        ).fetchall()
    return f"cursors {cursors}; log head {head}; snapshot {horizon}; transactions {running}"


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/api/healthz").status_code == 200
    except httpx.TransportError:
        return False

"""Drills on a server with fewer connection slots than the fleet would like, and SIGTERM while the
database is away, with real `ledgerflow worker`, `ledgerflow projector` and `ledgerflow serve` processes
on a throwaway cluster (see test_database_outages).

- 8 workers and 2 projectors, each with the default pool (up to 10) and its own listener, presence and
  notifier connections, on a server with `max_connections = 20` (17 slots for them): every one of 30
  one-node runs completes within a bound, no process exits, and the connection attempts the server
  saw (`log_connections`) stay bounded. Printed: the time the runs took, attempts and refusals, and what
  the processes logged about waiting.
- SIGTERM with the server stopped ends a worker, a projector and `serve` each within its grace, and a
  worker and a `serve` started while it was down (waiting for it to start).
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from eventstore import DatabaseSettings, EventStore, open_store
from eventstore.migrate import migrate
from tests.acceptance.pg_cluster import (
    WORKER_ROLE,
    Cluster,
    Process,
    start,
    stop_all,
    throwaway_cluster,
)
from tests.scarce_flows import registry
from tests.waiting import wait_until
from workflows import Engine

# Serial: it runs a PostgreSQL cluster of its own and times the waits for its slots, after the rest.
pytestmark = [pytest.mark.drill, pytest.mark.serial, pytest.mark.own_servers]

RUNS = 30
#: Every run is done this long after the first was started; the server refuses connections throughout.
RUNS_WITHIN = 120.0
#: What a stopped server and SIGTERM leave each role: its grace (10 s for a worker's nodes) plus a margin.
EXIT_WITHIN = 15.0
#: What SIGTERM leaves the whole fleet of ten, the database up, to exit.
FLEET_EXIT_WITHIN = 30.0
#: Connection attempts the whole fleet may make per second of the drill (10 processes): a tight
#: reconnect loop makes hundreds; backing off with jitter, a few each.
ATTEMPTS_PER_SECOND = 25.0
#: How long the drill watches the idle fleet after the runs, counting connection attempts.
STEADY = 20.0
#: Settings the drill's processes share with a deployment's: the pool and the leases are the defaults.
FLEET_ENV = {
    "LEDGERFLOW_WORKFLOWS": "tests.scarce_flows:registry",
    "LEDGERFLOW_POOL_MAX_SIZE": "10",
    "LEDGERFLOW_WORKFLOW_LEASE_TTL": "10",
    "LEDGERFLOW_WORKFLOW_HEARTBEAT_INTERVAL": "2",
    "LEDGERFLOW_PROJECTOR_LEASE_TTL": "10",
    "LEDGERFLOW_PROJECTOR_HEARTBEAT_INTERVAL": "3",
    "LEDGERFLOW_RECOVERY_INTERVAL": "2",
}


def _server_log(cluster: Cluster) -> Path:
    return cluster.root / "server.log"


def _attempts(text: str) -> tuple[int, int]:
    """Connection attempts the server saw (`log_connections`) and those it refused for lack of a slot."""
    received = len(re.findall(r"connection received:", text))
    refused = len(re.findall(r"too many clients already|remaining connection slots are reserved", text))
    return received, refused


def _count(process: Process, needle: str) -> int:
    return process.log.read_text(errors="replace").count(needle)


def test_a_fleet_short_of_connection_slots_completes_every_run(tmp_path: Path) -> None:
    with throwaway_cluster(max_connections=20, reserved=3, options="-c log_connections=on") as cluster:
        migrate(cluster.url(WORKER_ROLE))
        # The drill's own client is a superuser with one connection: it gets in through the reserved slots.
        store = open_store(
            DatabaseSettings(pool_min_size=1, pool_max_size=1, pinned_connections=0),
            url=cluster.url(),
            migrate=False,
        )
        engine = Engine(store, registry)
        processes: list[Process] = []
        try:
            for i in range(2):
                processes.append(start(cluster, tmp_path, f"projector-{i}", "projector", env=FLEET_ENV))
            for i in range(8):
                processes.append(
                    start(cluster, tmp_path, f"worker-{i}", "worker", "--name", f"w{i}", env=FLEET_ENV)
                )
            # Every process is up, or says it waits for a slot, before the runs start.
            wait_until(
                lambda: all(
                    _count(p, "_worker_started") or _count(p, '"database_unavailable"') for p in processes
                ),
                timeout=90,
                what="every process to start or wait",
            )
            log_from = _server_log(cluster).stat().st_size
            began = time.monotonic()
            runs = [engine.start("one_node", input={"n": n}).run_id for n in range(RUNS)]
            try:
                wait_until(
                    lambda: all(not engine.load(r).active for r in runs),
                    timeout=RUNS_WITHIN,
                    what=f"all {RUNS} runs to end",
                )
            except AssertionError:
                try:
                    print(_stalled_fleet(store, processes, _server_log(cluster).read_text(errors="replace")))
                except Exception as exc:  # the account is a help; the timeout stays what fails the drill
                    print(f"\nthe fleet's account could not be read: {exc!r}")
                raise
            took = time.monotonic() - began
            statuses = [engine.load(r).status for r in runs]
            # Then the fleet idles on a server still short of slots: the processes without a connection
            # keep trying, and the rate they try at is what a full server sees for as long as it lasts.
            threading.Event().wait(STEADY)
            window = time.monotonic() - began
            text = _server_log(cluster).read_text(errors="replace")
            (tmp_path / "server.log").write_text(text)  # kept for a look after the cluster is gone
            attempts, refused = _attempts(text[log_from:])
            exited = {p.name: p.popen.poll() for p in processes if p.popen.poll() is not None}
            started = sum(1 for p in processes if _count(p, "_worker_started"))
            lost = {p.name: _count(p, '"workflow_lease_lost"') for p in processes}
            no_connection = {p.name: _count(p, "no database connection became free") for p in processes}
            codes, stopped_in = sigterm_and_time(processes)
        finally:
            stop_all(processes)  # whatever is left, if the drill failed before its stop
            store.close()
        print(
            f"\n{RUNS} one-node runs done in {took:.1f} s; {started} of {len(processes)} processes started; "
            f"connection attempts {attempts} ({attempts / window:.1f}/s), refused {refused}, "
            f"in {window:.1f} s; "
            f"lease-lost warnings {sum(lost.values())}; connection waits that timed out "
            f"{sum(no_connection.values())}; SIGTERM to exit (s): {stopped_in}"
        )
        assert statuses == ["succeeded"] * RUNS
        assert exited == {}, f"processes exited: {exited}"
        assert codes == {p.name: 0 for p in processes}, codes
        # Ten processes stopping at once on a loaded 2-core machine: each logs its stop within a second of
        # the signal, and the interpreters' exits share the cores.
        assert all(t < FLEET_EXIT_WITHIN for t in stopped_in.values()), stopped_in
        assert attempts / window < ATTEMPTS_PER_SECOND, (attempts, window)
        assert lost == {p.name: 0 for p in processes}, f"leases lost while waiting for connections: {lost}"
        for p in processes:
            text = p.log.read_text(errors="replace")
            assert "Traceback" not in text, f"{p.name} logged a traceback:\n{text[-4000:]}"
            if "_worker_started" in text:
                assert '"connection_budget"' in text, f"{p.name} did not state its connection budget"


def _stalled_fleet(store: EventStore, processes: list[Process], server_log: str) -> str:
    """What a fleet whose runs did not end was doing: the server's sessions by role and state, the queue's
    rows by status, and each process's own account (whether it started, what it waited for, its last
    words). Printed when the drill fails, so a stall explains itself."""
    lines = ["\nthe runs did not end; what the fleet was doing:"]
    with store.pool.connection() as conn:
        for row in conn.execute(
            "SELECT usename, application_name, state, wait_event, count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
        ):
            lines.append(f"  session {row}")
        for row in conn.execute(
            "SELECT status, worker_name, count(*) FROM ledgerflow.workflow_queue GROUP BY 1, 2 ORDER BY 1, 2"
        ):
            lines.append(f"  queue {row}")
    attempts, refused = _attempts(server_log)
    lines.append(f"  server: {attempts} connection attempts, {refused} refused for lack of a slot")
    for p in processes:
        events = p.events()
        counts: dict[str, int] = {}
        for e in events:
            if e.get("event") in ("database_unavailable", "database_available_again"):
                key = f"{e['event']}/{e.get('noticed_by', '-')}"
                counts[key] = counts.get(key, 0) + 1
        started = any(str(e.get("event", "")).endswith("_worker_started") for e in events)
        lines.append(f"  {p.name}: started={started} exit={p.popen.poll()} {counts}")
        lines += [f"    {e.get('timestamp', '')[11:23]} {e.get('event')}" for e in events[-6:]]
    return "\n".join(lines)


def sigterm_and_time(processes: list[Process]) -> tuple[dict[str, int], dict[str, float]]:
    """SIGTERM to every process at once; each one's exit code and seconds until it exited."""
    sent = time.monotonic()
    for p in processes:
        p.popen.send_signal(signal.SIGTERM)
    took: dict[str, float] = {}
    codes: dict[str, int] = {}

    def all_exited() -> bool:
        for p in processes:
            if p.name not in codes and (code := p.popen.poll()) is not None:
                codes[p.name], took[p.name] = code, round(time.monotonic() - sent, 2)
        return len(codes) == len(processes)

    wait_until(all_exited, timeout=60, what="every process to exit")
    return codes, took


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_ends_every_role_while_the_database_is_away(tmp_path: Path) -> None:
    with throwaway_cluster() as cluster:
        migrate(cluster.url(WORKER_ROLE))
        env = {**FLEET_ENV, "LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
        processes = [
            start(cluster, tmp_path, "worker", "worker", "--name", "stopping", env=env),
            start(cluster, tmp_path, "projector", "projector", env=env),
            start(cluster, tmp_path, "serve", "serve", "--port", str(_free_port()), env=env),
        ]
        try:
            for p, started in (
                (processes[0], "workflow_worker_started"),
                (processes[1], "projector_worker_started"),
                (processes[2], "api_listening"),
            ):
                wait_until(lambda p=p, s=started: _count(p, s) > 0, timeout=60, what=f"{p.name} to start")
            wait_until(
                lambda: _count(processes[2], "workflow_worker_started") > 0, timeout=60, what="serve's worker"
            )
            cluster.pg_ctl("stop", "fast")
            # And processes that never reached the database: they wait for it to start.
            processes.append(start(cluster, tmp_path, "late-worker", "worker", "--name", "late", env=env))
            processes.append(
                start(cluster, tmp_path, "late-serve", "serve", "--port", str(_free_port()), env=env)
            )
            for p in processes:
                wait_until(
                    lambda p=p: _count(p, '"database_unavailable"') > 0,
                    timeout=30,
                    what=f"{p.name} to notice the database is away",
                )
            codes, took = sigterm_and_time(processes)
        finally:
            leftover = stop_all(processes, timeout=5)
        print(f"\nexit after SIGTERM with the database stopped (s): {took}; exit codes {codes}")
        assert leftover == {p.name: codes[p.name] for p in processes}
        assert codes == {p.name: 0 for p in processes}, codes
        assert all(t < EXIT_WITHIN for t in took.values()), took

"""Worker presence: a process whose session closed is taken over at once; a live one never is.

Processes that hold a presence and then "crash" are real child processes, SIGKILLed: the database sees
exactly what it sees when a worker dies. The transaction-mode pooler is a real PgBouncer when one is
installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from structlog.testing import capture_logs

from eventstore import EventStore
from ops.doctor import diagnose
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker, shared_worker_names
from workflows import events as ev
from workflows.node_end_writes import fence
from workflows.presence import Presence, PresenceMode
from workflows.queue_claims import Claimant
from workflows.recovery import sweep, take_back

ROOT = Path(__file__).resolve().parents[2]
LONG_LEASE = WorkerSettings(lease_ttl=3600)
HOLD_PRESENCE = """
import sys, threading
from workflows.presence import Presence
presence = Presence(sys.argv[1], worker_name=sys.argv[2], instance=sys.argv[3], on_orphans=lambda: None)
presence.start()
threading.Event().wait(600)
"""


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def registered(store: EventStore, instance: str) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.worker_presence WHERE instance = %s", (instance,)
        ).fetchone()
    return row == (1,)


@pytest.fixture
def presence_processes(store: EventStore) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def hold_presence_elsewhere(
    store: EventStore, worker: WorkflowWorker, started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """A child process holds `worker`'s presence, as the worker's own process would."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD_PRESENCE, store.url, worker.name, worker.instance], cwd=ROOT
    )
    started.append(p)
    wait_until(lambda: registered(store, worker.instance), timeout=30, what="the presence to register")
    return p


def watcher(store: EventStore, gone: threading.Event | None = None) -> Presence:
    peer = Presence(
        store.url,
        worker_name="peer",
        instance=uuid.uuid4().hex[:12],
        on_orphans=(gone or threading.Event()).set,
        interval=3600,  # the tests call watch_once themselves
    )
    peer.start()
    return peer


def reclaim_reasons(store: EventStore, run_id: uuid.UUID) -> list[str]:
    events = store.read_stream(ev.run_stream(run_id))
    return [e.data["reason"] for e in events if e.type == ev.NODE_RECLAIMED]


def test_a_crashed_process_is_taken_over_before_its_lease_lapses(
    store: EventStore, engine: Engine, presence_processes: list[subprocess.Popen[bytes]]
) -> None:
    run_id = engine.start("linear").run_id
    dies = WorkflowWorker(engine, registry, LONG_LEASE, name="dies")
    process = hold_presence_elsewhere(store, dies, presence_processes)
    assert len(dies._claim(1)) == 1
    peer = watcher(store)
    try:
        # Alive: its lease lasts an hour and its lock is held, so nothing is taken.
        assert peer.watch_once() is False
        assert sweep(engine, registry, worker_name="peer", instance="p1").reclaimed == 0
        process.send_signal(signal.SIGKILL)
        process.wait()
        wait_until(peer.watch_once, timeout=10, what="the watch to see the process gone")
        assert sweep(engine, registry, worker_name="peer", instance="p1").reclaimed == 1
    finally:
        peer.stop()
    assert reclaim_reasons(store, run_id) == ["worker_gone"]
    assert not registered(store, dies.instance), "the dead process's presence is forgotten"


def test_the_watch_asks_for_a_takeover_when_a_peer_dies(
    store: EventStore, presence_processes: list[subprocess.Popen[bytes]]
) -> None:
    dies = WorkflowWorker(Engine(store, registry), registry, LONG_LEASE, name="dies")
    process = hold_presence_elsewhere(store, dies, presence_processes)
    gone = threading.Event()
    peer = Presence(store.url, worker_name="peer", instance="peer1", on_orphans=gone.set, interval=0.05)
    peer.start()
    try:
        assert peer.mode is PresenceMode.SESSION
        process.send_signal(signal.SIGKILL)
        process.wait()
        wait_until(gone.is_set, timeout=10, what="the watch to call for a takeover")
    finally:
        peer.stop()


def test_a_clean_stop_is_not_read_as_a_crash(store: EventStore) -> None:
    leaving = Presence(store.url, worker_name="leaving", instance="l1", on_orphans=lambda: None)
    leaving.start()
    assert registered(store, "l1")
    peer = watcher(store)
    try:
        leaving.stop()
        assert not registered(store, "l1")
        assert peer.watch_once() is False
    finally:
        peer.stop()


def test_live_processes_sharing_a_name_keep_their_nodes(store: EventStore, engine: Engine) -> None:
    """A restarted worker takes its earlier process's nodes at once, but not those of a live process
    given the same name by mistake."""
    engine.start("linear")
    first = WorkflowWorker(engine, registry, LONG_LEASE, name="same")
    second = WorkflowWorker(engine, registry, LONG_LEASE, name="same")
    presences = [
        Presence(store.url, worker_name=w.name, instance=w.instance, on_orphans=lambda: None)
        for w in (first, second)
    ]
    for p in presences:
        p.start()
    try:
        assert len(first._claim(1)) == 1
        report = sweep(engine, registry, worker_name=second.name, instance=second.instance)
        assert report.reclaimed == 0
    finally:
        for p in presences:
            p.stop()


def test_a_presence_taken_before_the_server_started_is_not_trusted(
    store: EventStore, engine: Engine, presence_processes: list[subprocess.Popen[bytes]]
) -> None:
    """After a server restart every lock is gone, also those of live workers about to reconnect: their
    absence says nothing until each worker registers again."""
    engine.start("linear")
    worker = WorkflowWorker(engine, registry, LONG_LEASE, name="before-restart")
    process = hold_presence_elsewhere(store, worker, presence_processes)
    assert len(worker._claim(1)) == 1
    with store.pool.connection() as conn:
        # What the row of a worker registered before the server's last start looks like.
        conn.execute(
            "UPDATE ledgerflow.worker_presence SET since = pg_postmaster_start_time() - interval '1 second'"
            " WHERE instance = %s",
            (worker.instance,),
        )
    process.send_signal(signal.SIGKILL)
    process.wait()
    peer = watcher(store)
    try:
        assert peer.watch_once() is False
        assert sweep(engine, registry, worker_name="peer", instance="p1").reclaimed == 0
    finally:
        peer.stop()


def test_a_terminated_presence_session_registers_again(store: EventStore) -> None:
    presence = Presence(store.url, worker_name="w", instance="w1", on_orphans=lambda: None, interval=0.05)
    presence.start()
    try:
        with store.pool.connection() as conn:
            row = conn.execute(
                "SELECT backend_pid FROM ledgerflow.worker_presence WHERE instance = 'w1'"
            ).fetchone()
            assert row is not None
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))

        def registered_again() -> bool:
            with store.pool.connection() as conn:
                again = conn.execute(
                    "SELECT backend_pid FROM ledgerflow.worker_presence WHERE instance = 'w1'"
                ).fetchone()
            return again is not None and again[0] != row[0]

        # Its row is written before the presence takes it as its registration: both are waited for.
        wait_until(
            lambda: registered_again() and presence.mode is PresenceMode.SESSION,
            timeout=10,
            what="the presence to register again",
        )
    finally:
        presence.stop()


def test_the_watch_sees_a_lapsed_lease_at_once(store: EventStore, engine: Engine) -> None:
    """A hung worker (its session open, its presence held) is taken over once its lease lapses: the
    watch notices within one interval, without waiting for a periodic sweep."""
    run_id = engine.start("linear").run_id
    hung = WorkflowWorker(engine, registry, WorkerSettings(lease_ttl=0.5), name="hung")
    presence = Presence(store.url, worker_name=hung.name, instance=hung.instance, on_orphans=lambda: None)
    presence.start()
    peer = watcher(store)
    try:
        assert len(hung._claim(1)) == 1  # and no heartbeat renews it
        assert peer.watch_once() is False
        wait_until(peer.watch_once, timeout=10, what="the watch to see the lapsed lease")
        assert sweep(engine, registry, worker_name="peer", instance="p1").reclaimed == 1
    finally:
        peer.stop()
        presence.stop()
    assert reclaim_reasons(store, run_id) == ["lease_expired"]


# -- taking nodes back as claims ---------------------------------------------------------------------


def test_a_restarted_worker_takes_its_nodes_back_as_its_own_claims_in_one_transaction(
    store: EventStore, engine: Engine
) -> None:
    run_ids = [engine.start("linear").run_id for _ in range(3)]
    before = WorkflowWorker(engine, registry, LONG_LEASE, name="host-a")
    assert len(before._claim(3)) == 3  # then the process "dies": its leases would last an hour
    after = WorkflowWorker(engine, registry, LONG_LEASE, name="host-a")
    claimant = Claimant(after.name, after.instance, after.id, 60.0)
    report, claims = take_back(engine, registry, claimant, slots=2)
    assert (report.reclaimed, len(claims)) == (3, 2)
    for claim in claims:
        history = store.read_stream(ev.run_stream(claim.run_id))
        assert [e.type for e in history[-2:]] == [ev.NODE_RECLAIMED, ev.NODE_CLAIMED]
        assert history[-2].data["reason"] == "worker_restarted"
        assert (history[-1].data["worker"], history[-1].data["token"]) == (after.id, claim.token)
        assert claim.attempt == 2
        with engine.transaction() as conn:
            fence(conn, claim)  # the new claim holds its node: its writes go through
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM ledgerflow.workflow_queue WHERE run_id = ANY (%s) GROUP BY status",
            (run_ids,),
        ).fetchall()
    assert dict(rows) == {"claimed": 2, "ready": 1}, "beyond its free slots, nodes are ready for anyone"


# -- behind a transaction-mode pooler ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pgbouncer_url(store: EventStore) -> Iterator[str]:
    """The test database behind a real PgBouncer in transaction mode."""
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if binary is None:
        pytest.skip("PgBouncer is not installed")
    # PgBouncer refuses to run as root and drops to the postgres user: its files must be reachable.
    workdir = Path(tempfile.mkdtemp(prefix="ledgerflow-pgbouncer-"))
    workdir.chmod(0o777)
    try:
        yield from _run_pgbouncer(binary, store, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_pgbouncer(binary: str, store: EventStore, tmp_path: Path) -> Iterator[str]:
    info = psycopg.conninfo.conninfo_to_dict(store.url)
    port = free_port()
    (tmp_path / "users.txt").write_text(f'"{info.get("user", "postgres")}" ""\n')
    config = tmp_path / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={info.get('host', '127.0.0.1')} port={info.get('port', 5432)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {tmp_path / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 2\nmax_client_conn = 50\n"
        f"logfile = {tmp_path / 'pgbouncer.log'}\n"
    )
    for path in tmp_path.iterdir():
        path.chmod(0o666)
    args = [binary, str(config)]
    if os.geteuid() == 0:
        args[1:1] = ["-u", "postgres"]
    bouncer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = psycopg.conninfo.make_conninfo(store.url, host="127.0.0.1", port=str(port))

    def answers() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=1) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            assert bouncer.poll() is None, "PgBouncer ended; see its log in " + str(tmp_path)
            return False

    try:
        wait_until(answers, timeout=15, what="PgBouncer to accept connections")
        yield url
    finally:
        bouncer.terminate()
        bouncer.wait(timeout=10)


def test_behind_a_transaction_pooler_the_presence_falls_back_to_leases_and_says_so(
    store: EventStore, pgbouncer_url: str
) -> None:
    with capture_logs() as logs:
        presence = Presence(pgbouncer_url, worker_name="pooled", instance="b1", on_orphans=lambda: None)
        presence.start()
        try:
            assert presence.mode is PresenceMode.POOLED
            assert not registered(store, "b1"), "peers must not trust a lock held by a pooled backend"
            assert presence.watch_once() is False  # it still watches its peers
        finally:
            presence.stop()
    warnings = [e for e in logs if e["event"] == "workflow_presence_pooled"]
    assert len(warnings) == 1
    assert "leases" in warnings[0]["consequence"]


def test_a_restarted_worker_starts_the_nodes_it_takes_back_without_claiming_them_again(
    store: EventStore, engine: Engine
) -> None:
    """The worker's start-up sweep claims what it takes back for itself, up to its free threads, and
    starts those nodes: each run's NodeReclaimed and NodeClaimed come in one transaction, and no claim
    of the worker's own loop is needed (it has not run)."""
    run_ids = {engine.start("linear").run_id for _ in range(3)}
    before = WorkflowWorker(engine, registry, LONG_LEASE, name="host-b")
    assert len(before._claim(3)) == 3  # then the process "dies": its leases would last an hour
    gate = threading.Event()
    after = WorkflowWorker(engine, registry, WorkerSettings(concurrency=2, lease_ttl=3600), name="host-b")
    for _ in range(2):  # its threads wait: nothing it starts runs before the assertions below
        after._pool.submit(gate.wait)
    after.recover("startup")
    try:
        started = {claim.run_id for claim, _ in after._running.values()}
        assert len(started) == 2
        assert started <= run_ids
        for run_id in started:
            history = store.read_stream(ev.run_stream(run_id))
            reclaimed, claimed = history[-2:]
            assert (reclaimed.type, claimed.type) == (ev.NODE_RECLAIMED, ev.NODE_CLAIMED)
            assert claimed.data["worker"] == after.id
            assert reclaimed.transaction_id == claimed.transaction_id
    finally:
        after.stop()
        gate.set()
    (left,) = run_ids - started
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT status FROM ledgerflow.workflow_queue WHERE run_id = %s", (left,)
        ).fetchone()
    assert row == ("ready",), "beyond its free threads, nodes are ready for anyone"


def test_a_worker_starts_all_its_node_threads_before_it_takes_anything_back(
    store: EventStore, engine: Engine
) -> None:
    """Nodes taken back by the hundred start on threads that already exist: submitting one never waits
    for a new thread to be scheduled among the busy ones."""
    worker = WorkflowWorker(engine, registry, WorkerSettings(concurrency=40), name="host-c")
    worker._start_threads()
    threads = set(worker._pool._threads)
    assert len(threads) == 40
    gate = threading.Event()
    for _ in range(40):
        worker._pool.submit(gate.wait, 30)
    assert set(worker._pool._threads) == threads, "no node waited for a thread to be made"
    gate.set()
    worker._pool.shutdown()


def test_two_live_processes_with_one_name_are_warned_about_and_doctor_names_them(store: EventStore) -> None:
    first = Presence(store.url, worker_name="twin", instance="twin-a", on_orphans=lambda: None, interval=3600)
    second = Presence(
        store.url, worker_name="twin", instance="twin-b", on_orphans=lambda: None, interval=3600
    )
    first.start()
    try:
        with capture_logs() as logs:
            second.start()
        try:
            warned = [e for e in logs if e["event"] == "worker_name_in_use"]
            assert [(e["worker_name"], e["instance"], e["others"]) for e in warned] == [
                ("twin", "twin-b", ["twin-a"])
            ]
            with store.pool.connection() as conn:
                assert shared_worker_names(conn) == {"twin": 2}
            findings = {f.check: f for f in diagnose(store, [])}
            assert findings["worker name twin"].level == "warn"
            assert "2 live worker processes" in findings["worker name twin"].detail
        finally:
            second.stop()
        with store.pool.connection() as conn:
            assert shared_worker_names(conn) == {}, "a stopped namesake no longer counts"
    finally:
        first.stop()

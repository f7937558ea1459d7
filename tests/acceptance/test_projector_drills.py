"""Crash drills with real `ledgerflow projector` processes: SIGKILL at random moments, SIGSTOP past the
lease. Afterwards every event is applied exactly once and the projection equals a rebuild."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventstore import EventStore, NewEvent
from projector import cursor_rows, lease_rows, rebuild, run_rows, tables
from projector.digest import projection_digest
from tests.projections import counter
from tests.waiting import joined, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.drill


def start_worker(database_url: str, *, lease_ttl: float, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": database_url,
        "LEDGERFLOW_PROJECTIONS": "tests.projections:counter",
        "LEDGERFLOW_PROJECTOR_LEASE_TTL": str(lease_ttl),
        "LEDGERFLOW_PROJECTOR_HEARTBEAT_INTERVAL": str(lease_ttl / 4),
        "LEDGERFLOW_PROJECTOR_BATCH_SIZE": "25",
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "projector"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _diagnosis(store: EventStore, log: Path) -> str:
    """What an operator would look at when a takeover does not happen: the lease, the sessions of the
    test's database with what they wait for, and the workers' last log lines."""
    with store.pool.connection() as conn:
        lease = lease_rows.lease_of(conn, counter.name)
        sessions = conn.execute(
            "SELECT pid, application_name, state, wait_event_type, wait_event,"
            "       now() - xact_start AS in_transaction, left(query, 120)"
            "  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    lines = log.read_bytes().decode(errors="replace").splitlines()[-40:]
    return "\n".join([f"lease: {lease}", *map(str, sessions), "workers' log:", *lines])


def applied_stats(store: EventStore) -> tuple[int, int]:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*), coalesce(max(times), 0) FROM ledgerflow.applied").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def caught_up(store: EventStore) -> bool:
    with store.pool.connection() as conn:
        current = cursor_rows.get_cursor(conn, counter.name)
        return current is not None and cursor_rows.lag(conn, current.cursor).behind_head == 0


#: Events the appender lets the workers fall behind by, at most: twenty of their batches of 25, so a
#: worker killed moments after it first makes progress is killed while it applies, appends going on.
BACKLOG = 500


@pytest.fixture
def appender(store: EventStore) -> Iterator[threading.Event]:
    """Appends continuously in the background until the event is set, keeping the workers a backlog of
    up to BACKLOG events. Unbounded, it appended all the while a worker started up (several seconds
    apiece under load, nine times a drill): the backlog grew with each kill, to some 8,000 events, a
    core's worth of appends, then their catch-up and the rebuild, none of which the drill needs. Bounded,
    each kill still lands with some 300 to 500 events still to apply, appends going on."""
    with store.pool.connection() as conn, conn.transaction():
        # The tables exist before the first worker runs, so the test can watch them from the start.
        cursor_rows.ensure_cursor(conn, counter.name, counter.version)
        tables.ensure_live_tables(conn, counter)
    done = threading.Event()

    def behind(appended: int) -> bool:
        return appended - applied_stats(store)[0] >= BACKLOG

    def run() -> None:
        i = appended = 0
        while not done.is_set():
            if i % 16 == 0 and behind(appended):  # a look every 16 appends (about 32 events)
                # Until a worker applies some (or the test ends): a condition polled, as wait_until does.
                delay = 0.005
                while behind(appended) and not done.wait(delay):
                    delay = min(delay * 2, 0.1)
                continue
            store.append(f"drill-{i % 13}", [NewEvent("Add", {"amount": i}) for _ in range(1 + i % 3)])
            appended += 1 + i % 3
            i += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield done
    done.set()
    joined(thread)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The workers a test starts. Any still running at its end (a wait that timed out, an assertion) is
    killed, stopped ones too: none outlives its test's database, or warns from a later test."""
    workers: list[subprocess.Popen[bytes]] = []
    yield workers
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGCONT)
            worker.kill()
            worker.wait(timeout=30)


def assert_exactly_once_and_equal_to_rebuild(store: EventStore) -> None:
    with store.pool.connection() as conn:
        total = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
        live = projection_digest(conn, counter, counter.schema)
    assert total is not None
    assert applied_stats(store) == (total[0], 1), "an event was missed or applied twice"
    assert rebuild(store, counter).digest == live


def test_sigkill_at_random_moments(store: EventStore, appender: threading.Event, tmp_path: Path) -> None:
    rng = random.Random(7)
    log = tmp_path / "workers.log"
    kills = 0
    for _ in range(8):
        worker = start_worker(store.url, lease_ttl=1.0, log=log)
        before = applied_stats(store)[0]
        try:
            # Kill it while it is applying: once it has made progress, after a random extra moment.
            wait_until(
                lambda b=before: applied_stats(store)[0] > b, timeout=60, what="the worker to apply events"
            )
            threading.Event().wait(rng.uniform(0, 0.3))
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        kills += 1
    appender.set()
    final = start_worker(store.url, lease_ttl=1.0, log=log)
    try:
        # What is proved is exactly-once, not speed: the appender ran through eight restarts, and on a
        # busy machine its backlog takes a while to apply.
        wait_until(lambda: caught_up(store), timeout=300, what="catch-up after the kills")
    finally:
        final.send_signal(signal.SIGTERM)
        assert final.wait(timeout=30) == 0
    with store.pool.connection() as conn:
        lease = lease_rows.lease_of(conn, counter.name)
    assert lease is not None
    assert not lease.alive, "on SIGTERM the worker releases its lease at once"
    assert kills == 8
    assert_exactly_once_and_equal_to_rebuild(store)
    # Runs of the killed workers do not stay "running" for ever.
    with store.pool.connection() as conn:
        run_rows.mark_abandoned_runs(conn, 0.5)
        running = [r for r in run_rows.list_runs(conn, counter.name, 100) if r.status == "running"]
    assert running == []


def test_a_worker_paused_past_its_lease_cannot_commit(
    store: EventStore, appender: threading.Event, started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    log = tmp_path / "workers.log"
    paused = start_worker(store.url, lease_ttl=1.5, log=log)
    started.append(paused)
    wait_until(lambda: applied_stats(store)[0] > 50, timeout=30, what="the first worker to apply events")
    paused.send_signal(signal.SIGSTOP)
    with store.pool.connection() as conn:
        epoch_before = lease_rows.lease_of(conn, counter.name)
    taker = start_worker(store.url, lease_ttl=1.5, log=log)
    started.append(taker)

    def taken_over() -> bool:
        with store.pool.connection() as conn:
            lease = lease_rows.lease_of(conn, counter.name)
        return lease is not None and epoch_before is not None and lease.epoch > epoch_before.epoch

    try:
        wait_until(taken_over, timeout=30, what="the second worker to take the lease")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(store, log)}") from None
    progressed = applied_stats(store)[0]
    wait_until(lambda: applied_stats(store)[0] > progressed, timeout=30, what="the new owner to apply events")
    paused.send_signal(signal.SIGCONT)
    appender.set()
    wait_until(lambda: caught_up(store), timeout=60, what="catch-up")
    for worker in (paused, taker):
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert_exactly_once_and_equal_to_rebuild(store)
    assert b"projection_lease_lost" in log.read_bytes(), "the paused worker should notice it lost the lease"

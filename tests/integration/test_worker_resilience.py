"""Workers keep going: leases renewed while a version change rebuilds, one projection's failure confined
to it, an outage reported once, a serve role that dies restarted and reported."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from structlog.testing import capture_logs

from eventstore import DatabaseUnavailableError, EventStore, NewEvent, RecordedEvent
from eventstore.outage import Outage, OutageState
from ops.roles import Role
from projector import (
    ApplyContext,
    Projection,
    ProjectorWorker,
    Table,
    WorkerSettings,
    cursor_rows,
    lease_rows,
)
from tests.projections import make_counter
from tests.waiting import wait_until


def slow_projection(version: int) -> Projection:
    """A projection whose handler takes a while per event, so a rebuild of it lasts several leases."""
    slow = Projection(
        name="slow",
        version=version,
        tables=[Table("slow_seen", "CREATE TABLE {table} (position bigint PRIMARY KEY)")],
    )

    @slow.on_any
    def seen(ctx: ApplyContext, event: RecordedEvent) -> None:
        time.sleep(0.02)  # stands for real work
        ctx.execute("INSERT INTO {slow_seen} (position) VALUES (%s)", (event.position,))

    return slow


@pytest.fixture
def running() -> Iterator[list[ProjectorWorker]]:
    workers: list[ProjectorWorker] = []
    yield workers
    for w in workers:
        w.stop()


def run_in_thread(worker: ProjectorWorker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_the_lease_is_renewed_while_a_version_change_rebuilds(
    store: EventStore, running: list[ProjectorWorker]
) -> None:
    for i in range(60):
        store.append(f"s-{i % 3}", [NewEvent("Add", {"amount": i})])
    settings = WorkerSettings(lease_ttl=0.4, heartbeat_interval=0.1, batch_size=5, poll_interval=0.05)
    # Version 1 was applied once; the code now says version 2: taking the lease starts a rebuild.
    first = ProjectorWorker(store, [slow_projection(1)], settings)
    first.run_until_caught_up()
    first.release_all()
    holder = ProjectorWorker(store, [slow_projection(2)], settings, worker_id="holder")
    competitor = ProjectorWorker(store, [slow_projection(2)], settings, worker_id="competitor")
    running += [holder, competitor]
    holder_thread = run_in_thread(holder)
    wait_until(lambda: holder._leases, what="the holder to take the lease")
    competitor_thread = run_in_thread(competitor)

    def rebuilt() -> bool:
        with store.pool.connection() as conn:
            current = cursor_rows.get_cursor(conn, "slow")
        return current is not None and current.version == 2 and "slow" in holder._runners

    wait_until(rebuilt, timeout=30, what="the rebuild to finish")
    # The rebuild lasted many lease lengths; the holder kept its lease throughout.
    assert competitor._leases == {}
    with store.pool.connection() as conn:
        lease = lease_rows.lease_of(conn, "slow")
    assert lease is not None
    assert lease.owner == "holder"
    assert holder_thread.is_alive()
    assert competitor_thread.is_alive()


def test_one_projection_failing_does_not_stop_the_others(
    store: EventStore, running: list[ProjectorWorker]
) -> None:
    broken = Projection(
        name="broken", version=1, tables=[Table("broken", "CREATE TABLE {table} (this is not SQL")]
    )
    counter = make_counter()
    worker = ProjectorWorker(
        store, [broken, counter], WorkerSettings(heartbeat_interval=0.1, poll_interval=0.05)
    )
    running.append(worker)
    with capture_logs() as logs:
        thread = run_in_thread(worker)
        store.append("s", [NewEvent("Add", {"amount": 1})])

        def counted() -> bool:
            with store.pool.connection() as conn:
                return conn.execute("SELECT count(*) FROM ledgerflow.counts").fetchone() == (1,)

        wait_until(lambda: counter.name in worker._runners and counted(), what="the counter to apply")
        assert thread.is_alive()
    failures = [e for e in logs if e["event"] == "projection_take_failed"]
    assert failures
    assert failures[0]["projection"] == "broken"


def test_an_outage_is_logged_once_however_many_parts_notice_it() -> None:
    outage = Outage(worker="w")
    error = DatabaseUnavailableError("server closed the connection")
    with capture_logs() as logs:
        outage.failed(error)
        outage.failed(error, "listener")
        outage.failed(psycopg.OperationalError("terminating connection"))
        assert outage.snapshot().waiting
        outage.succeeded()  # the listener still fails: the outage goes on
        assert outage.waiting
        outage.succeeded("listener")
        assert not outage.waiting  # work resumes at once...
        outage.failed(error)  # ...and a broken connection met just after belongs to the same outage
        outage.succeeded()

        def over() -> bool:
            outage.settle()
            return "database_available_again" in [e["event"] for e in logs]

        wait_until(over, timeout=5, what="the outage to be logged as over")
    # This outage's lines only: another test's worker, still stopping on a thread of this process, may log.
    mine = [e for e in logs if e.get("worker") == "w"]
    assert [e["event"] for e in mine] == ["database_unavailable", "database_available_again"]
    assert all("exc_info" not in e for e in mine)
    assert not outage.snapshot().waiting


class _Dies:
    """A worker that dies at once the first times it runs, then runs until stopped."""

    attempts = 0

    def __init__(self, deaths: int) -> None:
        self.deaths = deaths
        self.stopping = threading.Event()

    def run(self) -> None:
        _Dies.attempts += 1
        if _Dies.attempts <= self.deaths:
            raise RuntimeError("a bug")
        self.stopping.wait()

    def stop(self) -> None:
        self.stopping.set()

    def database_state(self) -> OutageState:
        return OutageState(waiting=False)


def test_a_serve_role_that_dies_is_restarted_and_reported() -> None:
    _Dies.attempts = 0
    role = Role("projector", lambda: _Dies(deaths=2))
    with capture_logs() as logs:
        role.start()
        report = wait_until(
            lambda: (r := role.report()).state == "running" and r.restarts == 2 and r, what="two restarts"
        )
        role.stop()
        role.join(5)
    assert report.last_error == "RuntimeError: a bug"
    assert role.report().state == "stopped"
    assert [e["event"] for e in logs].count("serve_role_died") == 2

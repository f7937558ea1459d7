"""Drill: `ledgerflow subjects forget` while two appender processes and a projector run. Afterwards no
personal value of the forgotten subject is readable from the log or from a projection rebuilt from it;
the other subject's values all are."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from eventstore import REDACTED, Cursor, DatabaseSettings, EventStore, generate_master_key, open_store
from projector import ApplyContext, LeaseLost, Projection, ProjectorWorker, Table, WorkerSettings, rebuild
from tests.acceptance.cli_runs import cli_env, run_cli
from tests.waiting import wait_until

pytestmark = pytest.mark.drill


def _book() -> Projection:
    book = Projection(
        name="drill_email_book",
        version=1,
        tables=[Table("drill_emails", "CREATE TABLE {table} (position bigint PRIMARY KEY, email text)")],
    )

    @book.on("DrillCustomerSeen")
    def add(ctx: ApplyContext, event: object) -> None:
        ctx.execute(
            "INSERT INTO {drill_emails} VALUES (%s, %s)",
            (event.position, event.data["email"]),  # type: ignore[attr-defined]
        )

    return book


def _versions(store: EventStore) -> int:
    return min((store.stream_version(f"customer-{n}") or 0) for n in ("a", "b"))


def test_forget_while_appenders_and_a_projector_run(database_url: str, tmp_path: Path) -> None:
    master = generate_master_key()
    env = cli_env(database_url, LEDGERFLOW_MASTER_KEY=master)
    stop = tmp_path / "stop"
    appenders = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.acceptance.personal_appender", name, str(stop)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    book = _book()
    settings = DatabaseSettings(master_key=master)  # type: ignore[arg-type]
    with open_store(settings, url=database_url, migrate=False) as store:
        worker = ProjectorWorker(
            store, [book], WorkerSettings(lease_ttl=5, heartbeat_interval=1, batch_size=50)
        )
        projecting = threading.Event()

        def project() -> None:
            while not projecting.is_set():
                # A loaded machine can outlast a lease; the next round takes it again.
                with contextlib.suppress(LeaseLost):
                    worker.run_until_caught_up()

        projector = threading.Thread(target=project)
        projector.start()
        try:
            wait_until(lambda: _versions(store) >= 20, timeout=120, what="appends before the forgetting")
            forgot = run_cli(
                database_url, "subjects", "forget", "victim", "--yes", LEDGERFLOW_MASTER_KEY=master
            )
            assert forgot.returncode == 0, forgot.stderr
            after = _versions(store)
            wait_until(
                lambda: _versions(store) >= after + 20, timeout=120, what="appends after the forgetting"
            )
        finally:
            stop.touch()
            outputs = [p.communicate(timeout=120)[0] for p in appenders]
            projecting.set()
            projector.join(timeout=120)
        assert [p.returncode for p in appenders] == [0, 0]
        counts = [json.loads(o.strip().splitlines()[-1]) for o in outputs]
        assert all(c["appended"] > 0 for c in counts)
        # The appenders have stopped: the rebuild reads the whole log. (The worker's lease may have lapsed
        # while this thread waited for them on a loaded machine; it has nothing left to do.)
        with contextlib.suppress(LeaseLost):
            worker.release_all()
        rebuild(store, book)
        events, cursor = [], Cursor()
        while True:
            page = store.read_all(cursor, tenant="default", types=["DrillCustomerSeen"], limit=1000)
            events.extend(page.events)
            cursor = page.cursor
            if page.caught_up:
                break
        assert len(events) == sum(c["appended"] for c in counts)
        victims = [e for e in events if e.data["customer_id"] == "victim"]
        assert victims
        assert {e.data["email"] for e in victims} == {REDACTED}
        assert all(e.data["email"].startswith("bystander-") for e in events if e not in victims)
        with store.pool.connection() as conn:
            rows = conn.execute("SELECT string_agg(email, ' ') FROM ledgerflow.drill_emails").fetchone()
        assert rows is not None
        assert "victim-" not in rows[0]
        assert "bystander-" in rows[0]

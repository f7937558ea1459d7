"""`ledgerflow workflows retention` in a real process, SIGKILLed midway and run again: every due run is
released exactly once, the rest by the next pass (which first finishes the killed pass's action), and no
run still going is touched; the tables then equal their rebuild."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from eventstore import EventStore, open_store
from ops.settings import Settings
from projector import verify
from tests.acceptance.cli_runs import cli_env, invoke_cli
from tests.flows import registry
from tests.run_tables import project_runs
from tests.waiting import wait_until
from workflows import Engine, RunFilter, search_runs, workflow_tables
from workflows import events as ev

ENV = {"LEDGERFLOW_WORKFLOWS": "tests.flows:registry", "LEDGERFLOW_RUN_RETENTION": "PT0.001S"}
RUNS = 400
#: Runs per page of a bulk action's walk (workflows.bulk): the pass is killed after its first.
PAGE = 200


def _processed(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(done + skipped + failed), 0) FROM ledgerflow.bulk_actions"
        ).fetchone()
    return int(row[0]) if row else 0


def _second_page_run(store: EventStore) -> uuid.UUID:
    """The first run of the second page of the pass's walk over the due runs (newest first)."""
    due = RunFilter(workflow="linear", statuses=("cancelled",))
    first = search_runs(store, tenant="default", filter=due, limit=PAGE)
    assert first.next is not None, "the pass has a second page"
    second = search_runs(store, tenant="default", filter=due, limit=PAGE, after=first.next)
    return uuid.UUID(str(second.runs[0]["run_id"]))


@contextlib.contextmanager
def _stream_held(store: EventStore, run_id: uuid.UUID) -> Iterator[None]:
    """The run's stream row locked: a page that appends to it waits, its transaction open."""
    with psycopg.connect(store.url) as conn:
        conn.execute(
            "SELECT 1 FROM ledgerflow.streams WHERE tenant = 'default' AND stream_id = %s FOR UPDATE",
            (ev.run_stream(run_id),),
        )
        yield


def _blocked(store: EventStore) -> bool:
    """Whether a session of the test's database waits for a lock."""
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def _releases(store: EventStore, run_id: uuid.UUID) -> int:
    return sum(1 for e in store.read_stream(ev.run_stream(run_id)) if e.type == ev.RUN_RELEASED)


@pytest.mark.drill
def test_a_retention_pass_killed_midway_and_run_again_releases_every_due_run_once(database_url: str) -> None:
    with open_store(Settings(database_url=database_url)) as store:
        engine = Engine(store, registry)
        due = [engine.start("linear").run_id for _ in range(RUNS)]
        for run_id in due:
            engine.cancel(run_id)  # nothing in flight: ended at once
        going = [engine.start("linear").run_id for _ in range(5)]
        project_runs(store)
        # The pass is killed midway by a lock, not by timing: its second page waits on a row lock of one of
        # that page's run streams, with the first page committed.
        with _stream_held(store, _second_page_run(store)):
            process = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "workflows", "retention"],
                env=cli_env(database_url, **ENV),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_until(
                    lambda: _processed(store) >= PAGE and _blocked(store),
                    timeout=120,
                    what="the retention pass to wait in its second page",
                )
            finally:
                process.kill()
                process.wait(timeout=30)
            killed_at = _processed(store)  # read while its second page still waits
        assert killed_at == PAGE, "killed midway: one page done"
        print(f"killed after {killed_at} of {RUNS} runs")

        again = invoke_cli(database_url, "workflows", "retention", "--json", **ENV)
        assert again.returncode == 0, again.stderr
        actions = json.loads(again.stdout)
        assert actions[0]["state"] == "completed", "the killed pass's action is finished first"
        assert sum(a["done"] for a in actions) + killed_at >= RUNS
        assert all(_releases(store, r) == 1 for r in due), "every due run released exactly once"
        assert all(_releases(store, r) == 0 and engine.load(r).active for r in going)
        project_runs(store)
        listed = {r["run_id"] for r in search_runs(store, tenant="default", limit=50).runs}
        assert listed == set(going)
        assert verify(store, workflow_tables).equal

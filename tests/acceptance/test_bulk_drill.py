"""`ledgerflow workflows bulk cancel` in a real process, SIGKILLed midway and continued: every matching run
is cancelled exactly once, the rest of them by the continuation, and no other run is touched; then the
dry run, the confirmation and the limit, as a user meets them. The commands not killed run in this
process (`invoke_cli`)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from eventstore import EventStore, open_store
from ops.settings import Settings
from tests.acceptance.cli_runs import cli_env, invoke_cli
from tests.flows import registry
from tests.run_tables import project_runs
from tests.waiting import wait_until
from workflows import Engine
from workflows import events as ev

FLOWS = {"LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
RUNS = 600


def _action(store: EventStore) -> tuple[uuid.UUID, int, str] | None:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT id, done + failed + skipped, state FROM ledgerflow.bulk_actions"
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def _cancels(store: EventStore, run_id: uuid.UUID) -> int:
    stream = store.read_stream(ev.run_stream(run_id))
    return sum(1 for e in stream if e.type == ev.RUN_CANCEL_REQUESTED)


# A drill (a real process SIGKILLed): the quick run leaves it out, CI's parallel half runs it.
@pytest.mark.drill
def test_a_bulk_cancel_killed_midway_and_continued_cancels_every_run_once(database_url: str) -> None:
    with open_store(Settings(database_url=database_url)) as store:
        engine = Engine(store, registry)
        chosen = [engine.start("linear", input=None, tags={"batch": "k"}).run_id for _ in range(RUNS)]
        others = [engine.start("linear", input=None, tags={"batch": "keep"}).run_id for _ in range(5)]
        project_runs(store)
        process = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "workflows", "bulk", "cancel", "--tag", "batch=k", "--yes"],
            env=cli_env(database_url, **FLOWS),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            at_kill = wait_until(
                lambda: (a := _action(store)) is not None and a[1] >= 20 and a,
                timeout=120,
                what="the bulk action under way",
            )
        finally:
            process.kill()
            process.wait(timeout=30)
        action_id, processed, state = _action(store) or at_kill
        assert state == "running", "killed midway"
        assert processed < RUNS, "killed midway"
        print(f"killed after {processed} of {RUNS} runs")

        shown = invoke_cli(database_url, "workflows", "bulk", "show", str(action_id), "--json")
        assert json.loads(shown.stdout)["state"] == "running"
        resumed = invoke_cli(database_url, "workflows", "bulk", "continue", str(action_id), "--json", **FLOWS)
        assert resumed.returncode == 0, resumed.stderr
        ended = json.loads(resumed.stdout)
        assert (ended["state"], ended["matched"], ended["done"], ended["failed"], ended["skipped"]) == (
            "completed",
            RUNS,
            RUNS,
            0,
            0,
        )
        assert all(_cancels(store, r) == 1 for r in chosen), "every matching run cancelled exactly once"
        assert all(engine.load(r).active and _cancels(store, r) == 0 for r in others)
        wrong = invoke_cli(database_url, "workflows", "bulk", "show", str(action_id), "--tenant", "acme")
        assert wrong.returncode == 1
        assert "tenant" in wrong.stderr


def test_dry_run_confirmation_and_limit(database_url: str) -> None:
    with open_store(Settings(database_url=database_url)) as store:
        engine = Engine(store, registry)
        runs = [engine.start("linear", input=None, tags={"batch": "d"}).run_id for _ in range(3)]
        project_runs(store)
        dry = invoke_cli(
            database_url, "workflows", "bulk", "cancel", "--tag", "batch=d", "--dry-run", **FLOWS
        )
        assert dry.returncode == 0, dry.stderr
        assert "would touch 3 runs" in dry.stdout
        refused = invoke_cli(
            database_url, "workflows", "bulk", "cancel", "--tag", "batch=d", input="n\n", **FLOWS
        )
        assert refused.returncode != 0
        assert "cancel 3 runs" in refused.stderr
        limited = invoke_cli(
            database_url,
            "workflows",
            "bulk",
            "cancel",
            "--tag",
            "batch=d",
            "--yes",
            LEDGERFLOW_BULK_MAX_RUNS="2",
            **FLOWS,
        )
        assert limited.returncode == 1
        assert "LEDGERFLOW_BULK_MAX_RUNS" in limited.stderr
        assert _action(store) is None
        assert all(engine.load(r).active for r in runs)
        done = invoke_cli(database_url, "workflows", "bulk", "cancel", "--tag", "batch=d", "--yes", **FLOWS)
        assert done.returncode == 0, done.stderr
        assert "3 done" in done.stdout
        assert all(engine.load(r).status == "cancelled" for r in runs)


def test_bulk_pause_and_resume_from_the_cli(database_url: str) -> None:
    with open_store(Settings(database_url=database_url)) as store:
        engine = Engine(store, registry)
        runs = [engine.start("linear", input=None, tags={"batch": "p"}).run_id for _ in range(3)]
        other = engine.start("linear", input=None, tags={"batch": "o"}).run_id
        project_runs(store)
        paused = invoke_cli(database_url, "workflows", "bulk", "pause", "--tag", "batch=p", "--yes", **FLOWS)
        assert paused.returncode == 0, paused.stderr
        assert "3 done" in paused.stdout
        assert all(engine.load(r).paused for r in runs)
        assert not engine.load(other).paused
        project_runs(store)
        dry = invoke_cli(
            database_url, "workflows", "bulk", "resume", "--status", "paused", "--dry-run", **FLOWS
        )
        assert "would touch 3 runs" in dry.stdout, dry.stderr
        resumed = invoke_cli(
            database_url, "workflows", "bulk", "resume", "--status", "paused", "--yes", "--json", **FLOWS
        )
        assert resumed.returncode == 0, resumed.stderr
        assert (json.loads(resumed.stdout)["kind"], json.loads(resumed.stdout)["done"]) == ("resume", 3)
        assert all(engine.load(r).status == "running" for r in runs)

"""`ledgerflow workflows pause|resume` with the CLI's commands run in this process
(`invoke_cli`) against a fresh database."""

from __future__ import annotations

import subprocess

from eventstore import EventStore
from tests.acceptance.cli_runs import invoke_cli
from tests.flows import registry
from workflows import Engine
from workflows import events as ev


def lf(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return invoke_cli(database_url, *args, LEDGERFLOW_WORKFLOWS="tests.flows:registry")


def test_pause_and_resume_from_the_command_line(database_url: str, store: EventStore) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("linear").run_id
    paused = lf(database_url, "workflows", "pause", str(run_id), "--interrupt-running")
    assert paused.returncode == 0, paused.stderr
    assert f"run {run_id}: paused" in paused.stdout
    assert engine.load(run_id).status == "paused"
    resumed = lf(database_url, "workflows", "resume", str(run_id))
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: running" in resumed.stdout
    types = [e.type for e in store.read_stream(ev.run_stream(run_id))]
    assert types.count(ev.RUN_PAUSED) == 1
    assert types.count(ev.RUN_RESUMED) == 1
    paused_event = next(e for e in store.read_stream(ev.run_stream(run_id)) if e.type == ev.RUN_PAUSED)
    assert paused_event.data["actor"] == "cli"

    engine.cancel(run_id)
    refused = lf(database_url, "workflows", "pause", str(run_id))
    assert refused.returncode != 0
    assert "already cancelled" in refused.stderr + refused.stdout
    other = lf(database_url, "workflows", "resume", str(run_id), "--tenant", "acme")
    assert other.returncode != 0
    assert "no run" in other.stderr + other.stdout

"""`ledgerflow workflows retention [--dry-run]`, `workflows show` of a released run and `workflows restore`,
with the CLI's commands run in this process (`invoke_cli`) against a fresh database."""

from __future__ import annotations

import json
import subprocess

from eventstore import EventStore
from projector import ProjectorWorker
from tests.acceptance.cli_runs import invoke_cli
from tests.flows import registry
from workflows import Engine, release_of, workflow_tables


def lf(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    # A millisecond: the runs this test ends are due as soon as they have ended.
    return invoke_cli(
        database_url, *args, LEDGERFLOW_WORKFLOWS="tests.flows:registry", LEDGERFLOW_RUN_RETENTION="PT0.001S"
    )


def project(store: EventStore) -> None:
    worker = ProjectorWorker(store, [workflow_tables])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()


def test_a_retention_pass_a_released_run_shown_and_restored_from_the_command_line(
    database_url: str, store: EventStore
) -> None:
    engine = Engine(store, registry)
    ended = [engine.start("linear").run_id for _ in range(3)]
    for run_id in ended:
        engine.cancel(run_id)  # nothing in flight: cancelled at once
    going = engine.start("linear").run_id
    project(store)

    dry = lf(database_url, "workflows", "retention", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "linear: 3 runs ended over" in dry.stdout
    assert all(release_of(store, run_id) is None for run_id in ended), "a dry run releases nothing"

    done = lf(database_url, "workflows", "retention", "--json")
    assert done.returncode == 0, done.stderr
    (action,) = json.loads(done.stdout)
    assert (action["kind"], action["state"], action["done"], action["skipped"]) == (
        "release",
        "completed",
        3,
        0,
    )
    assert "3/3 runs" in done.stderr, "progress is shown"
    assert release_of(store, going) is None
    project(store)

    shown = lf(database_url, "workflows", "show", str(ended[0]))
    assert shown.returncode == 0, shown.stderr
    assert "released by retention at" in shown.stdout
    assert f"ledgerflow workflows restore {ended[0]}" in shown.stdout
    as_json = json.loads(lf(database_url, "workflows", "show", str(ended[0]), "--json").stdout)
    assert as_json["released"]["actor"] == f"bulk:{action['id']}"

    restored = lf(database_url, "workflows", "restore", str(ended[0]))
    assert restored.returncode == 0, restored.stderr
    assert release_of(store, ended[0]) is None
    again = lf(database_url, "workflows", "restore", str(ended[0]))
    assert again.returncode != 0
    assert "not released" in again.stdout + again.stderr
    assert "released by retention" not in lf(database_url, "workflows", "show", str(ended[0])).stdout

"""`ledgerflow workflows schedules`: the CLI's command run in this process, on a fresh database whose
schedules a worker has seen (started here with the clock given, as a worker's schedule keeper would)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta

from eventstore import EventStore
from tests.acceptance.cli_runs import invoke_cli
from workflows import Engine, Schedule, Workflow, WorkflowRegistry
from workflows.schedules import run_due_ticks

T0 = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)

registry = WorkflowRegistry()
nightly = Workflow("nightly", schedule=Schedule("0 3 * * *", catch_up="all", max_catch_up=2))
every_five = Workflow("every_five", schedule=Schedule("*/5 * * * *"))
for wf in (nightly, every_five):
    wf.node(name="work")(lambda ctx: ctx.input)
    registry.register(wf)


def lf(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    # The session's time zone is not UTC: cron ticks are UTC all the same.
    return invoke_cli(database_url, *args, PGTZ="America/New_York")


def test_schedules_are_listed_with_their_last_and_next_tick(database_url: str, store: EventStore) -> None:
    empty = lf(database_url, "workflows", "schedules")
    assert empty.returncode == 0, empty.stderr
    assert "no schedules yet" in empty.stdout
    assert json.loads(lf(database_url, "workflows", "schedules", "--json").stdout) == []

    engine = Engine(store, registry)
    run_due_ticks(engine, nightly, T0 + timedelta(hours=1))  # first sight: the schedule starts at 03:00
    [started] = run_due_ticks(engine, nightly, T0 + timedelta(days=1, hours=1))
    run_due_ticks(engine, every_five, T0 + timedelta(minutes=7))

    listed = lf(database_url, "workflows", "schedules", "--json")
    assert listed.returncode == 0, listed.stderr
    by_workflow = {row["workflow"]: row for row in json.loads(listed.stdout)}
    assert by_workflow == {
        "nightly": {
            "tenant": "default",
            "workflow": "nightly",
            "cron": "0 3 * * *",
            "catch_up": "all",
            "last_tick": "2026-03-02T03:00:00+00:00",
            "next_tick": "2026-03-03T03:00:00+00:00",
            "last_run_id": str(started.run_id),
            "ticks_started": 1,
            "ticks_skipped": 0,
        },
        "every_five": {
            "tenant": "default",
            "workflow": "every_five",
            "cron": "*/5 * * * *",
            "catch_up": "skip",
            "last_tick": "2026-03-01T03:05:00+00:00",
            "next_tick": "2026-03-01T03:10:00+00:00",
            "last_run_id": None,
            "ticks_started": 0,
            "ticks_skipped": 0,
        },
    }

    table = lf(database_url, "workflows", "schedules")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    nightly_line = next(line for line in lines if "nightly" in line)
    for shown in ("0 3 * * *", "all", "2026-03-02 03:00:00", "2026-03-03 03:00:00"):
        assert shown in nightly_line
    five_line = next(line for line in lines if "every_five" in line)
    for shown in ("*/5 * * * *", "skip", "2026-03-01 03:05:00", "2026-03-01 03:10:00"):
        assert shown in five_line

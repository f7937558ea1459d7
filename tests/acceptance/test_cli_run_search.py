"""`ledgerflow workflows start --tag`, `workflows list` with filters and pages, and `workflows history`,
the CLI's commands run in this process (`invoke_cli`)."""

from __future__ import annotations

import json

from eventstore import open_store
from ops.settings import Settings
from projector import ProjectorWorker
from tests.acceptance.cli_runs import invoke_cli
from tests.flows import registry
from workflows import Engine, workflow_tables

FLOWS = {"LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}


def test_tagged_runs_are_listed_by_filter_a_page_at_a_time(database_url: str) -> None:
    started = []
    for team in ("red", "blue"):
        result = invoke_cli(
            database_url, "workflows", "start", "linear", "--tag", f"team={team}", "--print-id", **FLOWS
        )
        assert result.returncode == 0, result.stderr
        started.append(result.stdout.strip())
    with open_store(Settings(database_url=database_url)) as store:
        # Two more red runs to page through, started in-process: a CLI process each would check nothing new.
        engine = Engine(store, registry)
        started[1:1] = [
            str(engine.start("linear", input=None, tags={"team": "red"}).run_id) for _ in range(2)
        ]
        worker = ProjectorWorker(store, [workflow_tables])
        worker.run_until_caught_up()
        worker.release_all()

    args = ("workflows", "list", "--tag", "team=red", "--status", "running", "--since", "1h", "--json")
    first = json.loads(invoke_cli(database_url, *args, "--limit", "2").stdout)
    assert len(first["runs"]) == 2
    assert first["next"]
    rest = json.loads(invoke_cli(database_url, *args, "--limit", "2", "--after", first["next"]).stdout)
    assert rest["next"] is None
    assert sorted(r["run_id"] for r in first["runs"] + rest["runs"]) == sorted(started[:3])
    table = invoke_cli(database_url, "workflows", "list", "--tag", "team=blue")
    assert started[3] in table.stdout
    assert "team=blue" in table.stdout
    other = json.loads(invoke_cli(database_url, *args, "--tenant", "acme").stdout)
    assert other == {"runs": [], "next": None}
    wrong = invoke_cli(database_url, "workflows", "list", "--after", first["next"])
    assert wrong.returncode == 1
    assert "another search" in wrong.stderr
    bad = invoke_cli(database_url, "workflows", "start", "linear", "--tag", "x", **FLOWS)
    assert bad.returncode != 0
    assert "KEY=VALUE" in bad.stderr

    history = invoke_cli(database_url, "workflows", "history", started[0], "--json")
    assert history.returncode == 0, history.stderr
    events = [json.loads(line) for line in history.stdout.splitlines()]
    assert [e["type"] for e in events] == ["RunStarted", "NodesReady"]
    assert "team=red" in events[0]["summary"]
    assert "RunStarted" in invoke_cli(database_url, "workflows", "history", started[0]).stdout
    elsewhere = invoke_cli(database_url, "workflows", "history", started[0], "--tenant", "acme")
    assert elsewhere.returncode == 1
    assert "no run" in elsewhere.stderr

"""`ledgerflow events types`, `read --upcast`: the CLI's commands (run in this process), with types
declared by a module named in LEDGERFLOW_EVENT_TYPES."""

from __future__ import annotations

import json
import subprocess

from eventstore import VERSION_KEY, open_store
from projector import event_type_catalogue, rebuild
from tests.acceptance.cli_runs import invoke_cli


def run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return invoke_cli(database_url, *args, LEDGERFLOW_EVENT_TYPES="tests.event_types")


def test_types_versions_counts_and_upcast_reads(database_url: str) -> None:
    old = ("append", "cart-1", "--type", "TestLineAdded", "--data", '{"total": 3}')
    assert run(database_url, *old, "--metadata", json.dumps({VERSION_KEY: 1})).returncode == 0
    new = ("append", "cart-1", "--type", "TestLineAdded", "--data", '{"amount_cents": 1, "currency": "EUR"}')
    assert run(database_url, *new).returncode == 0
    assert run(database_url, "append", "cart-1", "--type", "Untyped").returncode == 0

    read = run(database_url, "read", "cart-1", "--json").stdout.splitlines()
    stored = [json.loads(line)["data"] for line in read]
    assert stored[0] == {"total": 3}
    upcast = run(database_url, "read", "cart-1", "--json", "--upcast").stdout.splitlines()
    assert json.loads(upcast[0])["data"] == {"amount_cents": 300, "currency": "EUR"}

    before = run(database_url, "events", "types", "--json")
    assert before.returncode == 0, before.stderr
    listed = json.loads(before.stdout)
    assert listed["counted"] is False
    assert "LEDGERFLOW_PROJECTIONS" in listed["note"]
    (line_added,) = [t for t in listed["types"] if t["type"] == "TestLineAdded"]
    assert line_added["latest"] == 2
    assert line_added["versions"] == [1, 2]
    assert [(u["from"], u["to"]) for u in line_added["upcasters"]] == [(1, 2)]
    assert u_name(line_added) == "tests.event_types._line_added_1_to_2"

    with open_store(url=database_url, migrate=False) as store:
        rebuild(store, event_type_catalogue)
    after = json.loads(run(database_url, "events", "types", "--json").stdout)
    counts = {t["type"]: t["events"] for t in after["types"]}
    assert counts["TestLineAdded"] == {"1": 1, "2": 1}
    assert counts["Untyped"] == {"0": 1}
    table = run(database_url, "events", "types")
    assert "TestLineAdded" in table.stdout
    assert "v1: 1" in table.stdout


def u_name(listed: dict[str, list[dict[str, str]]]) -> str:
    return listed["upcasters"][0]["function"]

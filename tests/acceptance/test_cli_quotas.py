"""`ledgerflow quotas` and `ledgerflow workflows start --debounce-key`, the CLI's commands run in this process
(`invoke_cli`)."""

from __future__ import annotations

import json

from tests.acceptance.cli_runs import invoke_cli


def test_quotas_set_list_clear(database_url: str) -> None:
    done = invoke_cli(
        database_url, "quotas", "set", "acme", "--runs-in-flight", "3", "--starts-per-second", "2.5"
    )
    assert done.returncode == 0, done.stderr
    listed = invoke_cli(database_url, "quotas", "list", "--json")
    assert json.loads(listed.stdout) == {
        "acme": {"max_runs_in_flight": 3, "starts_per_second": 2.5, "appends_per_second": None}
    }
    refused = invoke_cli(database_url, "quotas", "set", "acme", "--runs-in-flight", "0")
    assert refused.returncode == 2
    assert invoke_cli(database_url, "quotas", "clear", "acme").returncode == 0
    assert json.loads(invoke_cli(database_url, "quotas", "list", "--json").stdout) == {}


def test_debounced_start(database_url: str) -> None:
    args = (
        "workflows",
        "start",
        "linear",
        "--debounce-key",
        "doc-7",
        "--debounce-window",
        "60",
        "--print-id",
    )
    env = {"LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
    first = invoke_cli(database_url, *args, "--input", '{"n": 1}', **env)
    again = invoke_cli(database_url, *args, "--input", '{"n": 2}', **env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout  # one run for the burst
    half = invoke_cli(database_url, "workflows", "start", "linear", "--debounce-key", "k", **env)
    assert half.returncode == 2
    assert "--debounce-window" in half.stderr

"""The real `ledgerflow` command, in a subprocess, against a fresh database."""

from __future__ import annotations

import json
import re
import subprocess

from tests.acceptance.cli_runs import run_cli


def run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(database_url, *args)


def test_append_read_and_idempotent_retry(database_url: str) -> None:
    args = ("append", "order-1", "--type", "Placed", "--data", '{"total": 5}', "--idempotency-key", "k1")
    first = run(database_url, *args)
    assert first.returncode == 0, first.stderr
    again = run(database_url, *args)
    assert "duplicate" in again.stdout
    read = run(database_url, "read", "order-1", "--json")
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert [(line["version"], line["data"]) for line in lines] == [(1, {"total": 5})]


def test_errors_are_one_line_with_what_to_do(database_url: str) -> None:
    run(database_url, "append", "s", "--type", "T")
    result = run(database_url, "append", "s", "--type", "T", "--expected", "no-stream")
    assert result.returncode == 1
    assert "wrong_expected_version" in result.stderr
    assert "Re-read the stream" in result.stderr
    assert "Traceback" not in result.stderr


def test_events_demo_appends_and_follows(database_url: str) -> None:
    result = run(database_url, "events-demo", "--events", "200", "--writers", "2")
    assert result.returncode == 0, result.stderr
    assert "appended and followed 200 events" in result.stdout


def test_migrate_reports_up_to_date(database_url: str) -> None:
    result = run(database_url, "migrate")
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout


def test_demo_kills_its_worker_and_the_run_resumes_at_the_next_item(database_url: str) -> None:
    result = run(
        database_url,
        "demo",
        "--tables",
        "8",
        "--llm-delay",
        "0.1",
        "--crash-at",
        "4",
        "--approve-after",
        "0.5",
    )
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # the terminal width wraps lines
    assert "killed worker" in out
    assert re.search(r"column_enrichment resumed at item (\d+) of 8, not at 1: the (\d+) items", out)
    resumed, finished = map(int, re.findall(r"resumed at item (\d+) of 8, not at 1: the (\d+) items", out)[0])
    assert resumed == finished + 1
    assert finished >= 4
    assert "run succeeded" in out
    assert "see its DAG in the console: LEDGERFLOW_WORKFLOWS=workflows.demo:registry ledgerflow serve" in out
    final_table = out.rsplit("ontology_extraction · succeeded", 1)[-1].split("•", 1)[0]
    assert "running" not in final_table, "no node of a finished run runs"
    assert "▶" not in final_table
    # Then an event starts the review, which waits for the approval the demo sends.
    assert "the trigger started review run" in out
    assert "waits for signal 'approve', holding no worker" in out
    assert "review run succeeded" in out
    assert "'approved': True" in out.rsplit("review run succeeded", 1)[1]
    assert "'by': 'demo reviewer'" in out.rsplit("review run succeeded", 1)[1]


def test_horizon_and_recover_answer_json_for_programs(database_url: str) -> None:
    horizon = run(database_url, "horizon", "--json")
    assert horizon.returncode == 0, horizon.stderr
    assert set(json.loads(horizon.stdout)) == {"xmin", "head_position", "waiting_events", "holders"}
    recover = run(database_url, "recover", "--json")
    assert recover.returncode == 0, recover.stderr
    found = json.loads(recover.stdout)
    assert found["report"]["reclaimed"] == 0
    assert set(found["queue"]) == {"ready", "running", "orphaned", "parked"}
    assert isinstance(found["recent"], list)

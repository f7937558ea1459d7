"""`ledgerflow db url` and `ledgerflow psql`: the database a user needs for the tour's SQL steps."""

from __future__ import annotations

import subprocess

from tests.acceptance.cli_runs import run_cli


def run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(database_url, *args)


def test_db_url_prints_the_url_alone_on_stdout(database_url: str) -> None:
    result = run(database_url, "db", "url")
    assert result.returncode == 0, result.stderr
    assert result.stdout == database_url + "\n"


def test_psql_runs_on_ledgerflows_database_with_the_arguments_given(database_url: str) -> None:
    result = run(database_url, "psql", "-At", "-c", "select count(*) from ledgerflow.events")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    failing = run(database_url, "psql", "-c", "select * from no_such_table")
    assert failing.returncode != 0, "psql's exit status is passed on"

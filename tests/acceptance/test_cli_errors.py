"""What a new user sees when the database or a setting is wrong: a line or two that say what failed and
what to do, exit status 1, no traceback (unless `--debug`), and never the password."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        env=os.environ | {"LEDGERFLOW_LOG_FORMAT": "json"} | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def with_params(url: str, **params: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(url), **params})  # type: ignore[arg-type]


def assert_told(result: subprocess.CompletedProcess[str], *advice: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    message = [line for line in result.stderr.splitlines() if not line.startswith("{")]  # drop log lines
    assert 1 <= len(message) <= 3, result.stderr
    for words in advice:
        assert words in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("params", "advice"),
    [
        ({"port": "1"}, ["Connection refused", "start PostgreSQL there"]),
        ({"user": "nobody_here", "password": "s3cret-pw"}, ['"nobody_here" does not exist', "user name"]),
        ({"dbname": f"missing_{uuid.uuid4().hex[:8]}"}, ["does not exist", "createdb missing_"]),
    ],
    ids=["refused", "unknown-role", "missing-database"],
)
def test_an_unusable_database_is_explained_in_a_line_or_two(
    admin_url: str, params: dict[str, str], advice: list[str]
) -> None:
    result = run({"LEDGERFLOW_DATABASE_URL": with_params(admin_url, **params)}, "workflows", "list")
    assert_told(result, *advice)
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_doctor_explains_an_unreachable_database_at_once(admin_url: str) -> None:
    result = run({"LEDGERFLOW_DATABASE_URL": with_params(admin_url, port="1")}, "doctor")
    assert result.returncode == 1
    assert "Connection refused" in " ".join(result.stdout.split())
    assert "Traceback" not in result.stderr


def test_doctor_on_a_database_without_migrations_says_to_migrate(fresh_database: str) -> None:
    result = run({"LEDGERFLOW_DATABASE_URL": fresh_database}, "doctor")
    assert result.returncode == 1
    assert "ledgerflow migrate" in " ".join(result.stdout.split())
    assert "Traceback" not in result.stderr


def test_an_invalid_setting_names_the_variable(database_url: str) -> None:
    env = {"LEDGERFLOW_DATABASE_URL": database_url, "LEDGERFLOW_WORKER_CONCURRENCY": "1010"}
    result = run(env, "workflows", "list")
    assert_told(result, "LEDGERFLOW_WORKER_CONCURRENCY=1010", "less than or equal to 1000")


def test_debug_shows_the_traceback(admin_url: str) -> None:
    refused = with_params(admin_url, port="1")
    result = run({"LEDGERFLOW_DATABASE_URL": refused}, "--debug", "workflows", "list")
    assert result.returncode == 1
    assert "Traceback" in result.stderr

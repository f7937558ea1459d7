"""The real `ledgerflow` command, run as a user runs it, against a test database."""

from __future__ import annotations

import os
import subprocess
import sys


def cli_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a command on `database_url`: JSON logs on stderr, wide tables, and `extra`."""
    return os.environ | {
        "LEDGERFLOW_DATABASE_URL": database_url,
        "LEDGERFLOW_LOG_FORMAT": "json",
        "COLUMNS": "200",
        **extra,
    }


def run_cli(database_url: str, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """`ledgerflow ARGS...`, to its end (at most 2 minutes), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        env=cli_env(database_url, **extra_env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

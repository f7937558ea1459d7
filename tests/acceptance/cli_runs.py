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


def invoke_cli(
    database_url: str, *args: str, input: str | None = None, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """`ledgerflow ARGS...` in this process (click's CliRunner), with the environment `run_cli` gives a
    process, for tests whose subject is what a command does rather than the process: a process costs
    about 0.4 s of CPU to start (its imports), most of a one-shot command's cost. Stdout and stderr come
    apart as a process's do, and the exit status is the one the process would exit with. An exception
    the command lets out fails the test (a process would print a traceback); the logging set-up the
    command makes (handlers on this process's stderr of the moment) is undone afterwards. The start-up,
    exit codes and logs of the real process keep their own tests (`run_cli`)."""
    import logging

    import structlog
    from click.testing import CliRunner

    from ops.cli.commands import cli

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    structlog_config = structlog.get_config()
    env = {
        "LEDGERFLOW_DATABASE_URL": database_url,
        "LEDGERFLOW_LOG_FORMAT": "json",
        "COLUMNS": "200",
        **extra_env,
    }
    try:
        result = CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=True)
    finally:
        root.handlers, root.level = handlers, level
        structlog.configure(**structlog_config)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(
            f"`ledgerflow {' '.join(args)}` raised {result.exception!r}\nstderr:\n{result.stderr}"
        ) from result.exception
    return subprocess.CompletedProcess(
        ["ledgerflow", *args], result.exit_code, stdout=result.stdout, stderr=result.stderr
    )

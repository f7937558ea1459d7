"""What a `ledgerflow` call loads before it answers: `--help` pages load no product package and none of
the libraries the commands use; the light commands load only what they use (no HTTP server, no
cryptography without personal fields, no rich for structlog, no workflow engine for the log's commands).

Each command runs in a fresh interpreter, as `python -m ops.cli` does, which then reports its
`sys.modules`: which modules were loaded is a fact of the code, not of the machine's load, so these tests
cannot flake the way a timing could.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.cli_runs import cli_env

#: Runs the CLI as `python -m ops.cli` would, then writes the names of the modules loaded to a file.
REPORT_MODULES = """
import json, runpy, sys
report, sys.argv = sys.argv[1], ["ledgerflow", *sys.argv[2:]]
try:
    runpy.run_module("ops.cli", run_name="__main__", alter_sys=True)
except SystemExit as exit:
    if exit.code not in (0, None):
        raise
finally:
    with open(report, "w") as out:
        json.dump(sorted(sys.modules), out)
"""

#: What no `--help` needs: every product package's insides and the libraries behind the commands.
NOT_FOR_HELP = {
    "projector",
    "workflows",
    "psycopg",
    "psycopg_pool",
    "pydantic",
    "pydantic_settings",
    "structlog",
    "rich",
    "cryptography",
    "opentelemetry",
    "fastapi",
    "uvicorn",
    "starlette",
    "asyncio",
}
#: What no light command needs.
NOT_FOR_LIGHT_COMMANDS = {
    "fastapi",
    "uvicorn",
    "starlette",
    "ops.api",
    "ops.serve",
    "cryptography",
    "pygments",  # rich's tracebacks, which structlog would import
    "rich.traceback",
    "opentelemetry.sdk",
}


def modules_loaded(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> set[str]:
    report = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", REPORT_MODULES, str(report), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(report.read_text()))


def within(modules: set[str], packages: set[str]) -> set[str]:
    """The modules that are one of `packages` or inside one."""
    return {m for m in modules if m in packages or any(m.startswith(p + ".") for p in packages)}


HELP_PAGES = [
    [],
    ["append"],
    ["read"],
    ["projections"],
    ["projections", "status"],
    ["workflows"],
    ["workflows", "list"],
    ["workflows", "retention"],
    ["worker"],
    ["projector"],
    ["serve"],
    ["log", "partitions"],
    ["tokens", "create"],
    ["subjects", "forget"],
]


@pytest.mark.parametrize("command", HELP_PAGES, ids=lambda c: " ".join([*c, "--help"]))
def test_help_loads_no_product_package(command: list[str], tmp_path: Path) -> None:
    loaded = modules_loaded([*command, "--help"], tmp_path)
    assert "ops.cli.commands" in loaded  # what answered was the CLI (a test that can fail)
    assert within(loaded, NOT_FOR_HELP) == set()
    # The facades only: their names import their modules when used.
    facades = {"eventstore", "eventstore._lazy", "eventstore.spi", "eventstore._guard"}
    assert within(loaded, {"eventstore"}) <= facades


def test_a_light_command_loads_what_it_uses_only(database_url: str, tmp_path: Path) -> None:
    env = cli_env(database_url)
    appended = modules_loaded(["append", "order-1", "--type", "Placed", "--data", '{"n": 1}'], tmp_path, env)
    assert {"eventstore.store", "psycopg"} <= appended  # it did append
    assert within(appended, NOT_FOR_LIGHT_COMMANDS | {"workflows", "projector", "rich"}) == set()

    read = modules_loaded(["read", "order-1"], tmp_path, env)
    assert "rich.table" in read  # its table
    assert within(read, NOT_FOR_LIGHT_COMMANDS | {"workflows", "projector"}) == set()


@pytest.mark.parametrize(
    "command", [["projections", "status"], ["workflows", "list"]], ids=lambda c: " ".join(c)
)
def test_an_operator_listing_loads_no_server_and_no_cryptography(
    command: list[str], database_url: str, tmp_path: Path
) -> None:
    loaded = modules_loaded(command, tmp_path, cli_env(database_url))
    assert "workflows" in loaded  # both show the workflow tables
    assert within(loaded, NOT_FOR_LIGHT_COMMANDS) == set()

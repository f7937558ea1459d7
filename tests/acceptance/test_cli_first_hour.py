"""The first hour with the CLI: answers come without start-up log lines; a malformed database URL is two
lines, not a traceback; long-running roles stop at once on a mistake (malformed URL, no such database, a
refused login) and wait only for an outage; `workflows show --outputs` prints the outputs; a table piped
to another program keeps its key column whole."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eventstore import EventStore
from tests.acceptance.cli_runs import cli_env, invoke_cli, run_cli
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker

MALFORMED = {
    "host-and-port": "localhost:5432",
    "scheme-typo": "postgresq://someone:s3cret-pw@localhost:5432/ledger",
}


def with_params(url: str, **params: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(url), **params})  # type: ignore[arg-type]


def test_an_answer_comes_without_start_up_log_lines(database_url: str) -> None:
    run_cli(database_url, "migrate")  # the migrations' own lines, if any, belong to the first call
    result = run_cli(database_url, "projections", "status", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no event_store_opened, nothing before or beside the answer
    assert json.loads(result.stdout)


@pytest.mark.parametrize("url", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_url_is_two_lines(database_url: str, url: str) -> None:
    result = run_cli(database_url, "workflows", "list", LEDGERFLOW_DATABASE_URL=url)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert "LEDGERFLOW_DATABASE_URL is malformed" in lines[0]
    assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in lines[1]
    assert "s3cret-pw" not in result.stderr


ROLES = {
    "worker": ["worker"],
    "projector": ["projector"],
    "serve": ["serve", "--port", "0", "--worker"],
}


def start(database_url: str, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", *args],
        env=cli_env(database_url, LEDGERFLOW_WORKFLOWS="tests.flows:registry"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def mistakes(admin_url: str) -> dict[str, tuple[str, str]]:
    """(URL, words of the advice) of each permanent mistake."""
    missing = f"missing_{uuid.uuid4().hex[:8]}"
    return {
        "malformed": (MALFORMED["scheme-typo"], "is malformed"),
        "missing-database": (with_params(admin_url, dbname=missing), f"createdb {missing}"),
        "unknown-role": (with_params(admin_url, user="nobody_here", password="s3cret-pw"), "user name"),  # noqa: S106
    }


@pytest.mark.parametrize("role", ROLES.keys())
@pytest.mark.parametrize("mistake", ["malformed", "missing-database", "unknown-role"])
def test_a_long_running_role_stops_at_once_on_a_mistake(admin_url: str, role: str, mistake: str) -> None:
    url, advice = mistakes(admin_url)[mistake]
    with start(url, ROLES[role]) as process:
        try:
            _, stderr = process.communicate(timeout=60)  # it would wait for ever on an outage
        finally:
            process.kill()
    assert process.returncode == 1, stderr
    assert "Traceback" not in stderr
    told = [line for line in stderr.splitlines() if not line.startswith("{")]
    assert len(told) == 2, stderr
    assert advice in stderr
    assert "s3cret-pw" not in stderr


@pytest.mark.parametrize("role", ["worker", "projector"])
def test_a_long_running_role_waits_for_an_outage(admin_url: str, role: str) -> None:
    with start(with_params(admin_url, port="1"), ROLES[role]) as process:
        seen: list[str] = []

        def read() -> None:
            assert process.stderr is not None
            seen.extend(process.stderr)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            wait_until(
                lambda: any("database_unavailable" in line for line in seen), timeout=60, what="a wait"
            )
            assert process.poll() is None  # waiting, not gone
        finally:
            process.terminate()
            process.wait(timeout=60)
            reader.join(timeout=10)


@pytest.fixture
def worker(store: EventStore) -> Iterator[Engine]:
    engine = Engine(store, registry)
    settings = WorkerSettings(concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1)
    w = WorkflowWorker(engine, registry, settings, name="outputs-worker")
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield engine
    w.stop()
    thread.join(timeout=30)


def test_show_outputs_prints_every_nodes_output(database_url: str, worker: Engine) -> None:
    started = worker.start("linear", input={"n": 5})
    wait_until(lambda: not worker.load(started.run_id).active, timeout=60, what="the run to end")
    env = {"LEDGERFLOW_WORKFLOWS": "tests.flows:registry"}
    shown = invoke_cli(database_url, "workflows", "show", str(started.run_id), "--outputs", **env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    outputs = lines[lines.index("outputs") + 1 :]
    assert [line.strip() for line in outputs] == ['first: {"n":5}', 'second: {"n":10}', 'third: {"n":11}']
    as_json = invoke_cli(database_url, "workflows", "show", str(started.run_id), "--outputs", "--json", **env)
    nodes = json.loads(as_json.stdout)["nodes"]
    assert {name: node["output"] for name, node in nodes.items()} == {
        "first": {"n": 5},
        "second": {"n": 10},
        "third": {"n": 11},
    }
    without = invoke_cli(database_url, "workflows", "show", str(started.run_id), **env)
    assert "outputs" not in without.stdout


def test_a_piped_table_keeps_its_key_column_whole(database_url: str) -> None:
    env = cli_env(database_url)
    del env["COLUMNS"]  # as a user's shell pipes it: no COLUMNS exported
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "projections", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "workflow_tables" in result.stdout
    assert "stream_catalogue" in result.stdout
    assert "…" not in result.stdout
    assert time.monotonic() - began < 120

"""Bulk actions and retention passes under way while PostgreSQL restarts, on a cluster of the drill's own.

1. `ledgerflow workflows bulk cancel` is in the middle of a page (its events appended, its transaction
   open) when the server restarts (fast): the command says the database is away, waits, and goes on; it
   exits 0 having cancelled every run once, its counts right.
2. `ledgerflow serve` works an API bulk pause in a background job and a retention pass in its retention
   role, each in the middle of a page, when the server stops (immediate). While it is down, a new bulk
   command and the API answer at once that the database is unavailable (exit 1 saying what to do; 503 with
   a JSON body), and a command in the middle of its action, told to wait 1 s, stops there saying how to
   finish it. Once it is back, both of the server's actions finish by themselves: every run paused or
   released once, the tables equal to their rebuild, and the outage logged as warnings, no traceback.

Each action is held in its second page by a row lock on one of that page's run streams, taken by the
drill before the action starts: the restart finds a page committed and a page in flight, every time.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from eventstore import DatabaseSettings, EventStore, open_store
from eventstore.migrate import migrate
from ops.auth import create_token
from projector import verify
from tests.acceptance.pg_cluster import ROOT, WORKER_ROLE, Cluster, once, retrying, throwaway_cluster
from tests.acceptance.serve_process import free_port, healthy
from tests.flows import registry
from tests.run_tables import project_runs
from tests.waiting import wait_until
from workflows import Engine, RunFilter, run_bulk_action, search_runs, workflow_tables
from workflows import events as ev

# Not serial: its cluster is its own (port and data directory) and it times nothing; each action is held
# in its page by a row lock, not by timing, so a busy machine slows it without changing what it proves.
pytestmark = pytest.mark.drill

#: Runs per action: two pages of the walk (200 a page), so that a restart finds one committed, one not.
RUNS = 210
PAGE = 200
CANCEL_KEPT = ("workflows", "bulk", "cancel", "--tag", "batch=keep", "--yes")


def _second_page_run(store: EventStore, wanted: RunFilter) -> uuid.UUID:
    """The first run of the second page of an action's walk over `wanted` (newest first)."""
    first = search_runs(store, tenant="default", filter=wanted, limit=PAGE)
    assert first.next is not None, "the action has a second page"
    second = search_runs(store, tenant="default", filter=wanted, limit=PAGE, after=first.next)
    return uuid.UUID(str(second.runs[0]["run_id"]))


@contextlib.contextmanager
def _stream_held(cluster: Cluster, run_ids: list[uuid.UUID]) -> Iterator[None]:
    """These runs' stream rows locked: a page that appends to one of them waits, its transaction open."""
    conn = psycopg.connect(cluster.url())
    try:
        conn.execute(
            "SELECT 1 FROM ledgerflow.streams WHERE tenant = 'default' AND stream_id = ANY(%s) FOR UPDATE",
            ([ev.run_stream(r) for r in run_ids],),
        )
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def _blocked(cluster: Cluster, application: str | None = None) -> int:
    """Backends of ledgerflow's role waiting for a lock (of one application: `ledgerflow-serve`, or
    `ledgerflow` for a command)."""
    with psycopg.connect(cluster.url(dbname="postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'"
            " AND (%s::text IS NULL OR application_name = %s)",
            (WORKER_ROLE, application, application),
        ).fetchone()
    return int(row[0]) if row else 0


def _actions(store: EventStore) -> dict[str, list[dict[str, Any]]]:
    """The bulk actions by kind, oldest first."""
    with store.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(
            "SELECT id, kind, state, matched, done, failed, skipped FROM ledgerflow.bulk_actions "
            "ORDER BY created_at"
        ).fetchall()
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["kind"], []).append(row)
    return out


def _events(store: EventStore, event_type: str) -> dict[str, int]:
    """Events of a type per stream, straight from the log."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT stream_id, count(*) FROM ledgerflow.events WHERE event_type = %s GROUP BY stream_id",
            (event_type,),
        ).fetchall()
    return {stream: int(count) for stream, count in rows}


def _env(cluster: Cluster, **more: str) -> dict[str, str]:
    return os.environ | {
        "LEDGERFLOW_DATABASE_URL": cluster.url(WORKER_ROLE),
        "LEDGERFLOW_LOG_FORMAT": "json",
        **more,
    }


def _cli(cluster: Cluster, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", *args],
        cwd=ROOT,
        env=_env(cluster, LEDGERFLOW_WORKFLOWS="tests.flows:registry", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def _told_on_failure(process: subprocess.Popen[str]) -> Iterator[None]:
    """On a failure within, the process is killed and the failure says what it printed."""
    try:
        yield
    except BaseException as exc:
        process.kill()
        out, err = process.communicate(timeout=30)
        raise AssertionError(f"{exc}; the command printed:\n{out}\n{err[-6000:]}") from exc


def _counts(action: dict[str, Any]) -> tuple[Any, ...]:
    return (action["state"], action["matched"], action["done"], action["failed"], action["skipped"])


def _serve(cluster: Cluster, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`ledgerflow serve` with the API and the worker, whose retention role passes once at start."""
    env = _env(
        cluster,
        LEDGERFLOW_WORKFLOWS="tests.waiting_flows:registry",  # its worker claims no `linear` node
        LEDGERFLOW_RUN_RETENTION="PT0.001S",
        LEDGERFLOW_RETENTION_INTERVAL="3600",  # one pass at start; another only if it must resume
        # Nor does the API take up stopped actions while the drill lasts: the job and the role must each
        # finish their own.
        LEDGERFLOW_BULK_RESUME_AFTER="3600",
    )
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "serve", "--api", "--worker", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def _unavailable(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


def test_bulk_actions_and_retention_finish_across_database_restarts(tmp_path: Path) -> None:
    took: dict[str, float] = {}
    with throwaway_cluster() as cluster:
        migrate(cluster.url(WORKER_ROLE))
        settings = DatabaseSettings(pool_min_size=1, pool_max_size=3)
        # The processes' own role: it owns what the drill's projections create, as in a deployment.
        with open_store(settings, url=cluster.url(WORKER_ROLE), migrate=False) as store:
            engine = Engine(store, registry)
            old = [engine.start("linear", tags={"batch": "old"}).run_id for _ in range(RUNS)]
            for run_id in old:
                engine.cancel(run_id)  # nothing in flight: ended at once, due for retention
            by_cli = [engine.start("linear", tags={"batch": "cli"}).run_id for _ in range(RUNS)]
            by_api = [engine.start("linear", tags={"batch": "api"}).run_id for _ in range(RUNS)]
            kept = [engine.start("linear", tags={"batch": "keep"}).run_id for _ in range(3)]
            project_runs(store)
            took["cli_after_restart"] = _cli_through_a_restart(cluster, store, by_cli)
            retrying(lambda: project_runs(store))  # the command's cancels: those runs are due too
            log = tmp_path / "serve.log"
            took |= _serve_through_a_stop(cluster, store, log)

            paused = retrying(lambda: _events(store, ev.RUN_PAUSED))
            assert [paused.get(ev.run_stream(r), 0) for r in by_api] == [1] * RUNS, "each run paused once"
            assert sum(paused.values()) == RUNS, "no other run paused"
            released = _events(store, ev.RUN_RELEASED)
            assert [released.get(ev.run_stream(r), 0) for r in old + by_cli] == [1] * (2 * RUNS)
            assert sum(released.values()) == 2 * RUNS, "no run still going released"
            project_runs(store)
            listed = search_runs(store, tenant="default", limit=2 * RUNS).runs
            assert {uuid.UUID(str(r["run_id"])) for r in listed} == set(by_api + kept), "released: gone"
            assert verify(store, workflow_tables).equal
    print(f"\nseconds: {took}")


def _cli_through_a_restart(cluster: Cluster, store: EventStore, runs: list[uuid.UUID]) -> float:
    """`workflows bulk cancel` of `runs`, its second page in flight when the server restarts (fast): it
    finishes, each run cancelled once. How long it took once the server was back."""
    held = _second_page_run(store, RunFilter(tags=(("batch", "cli"),)))
    with _stream_held(cluster, [held]):
        cli = _cli(cluster, "workflows", "bulk", "cancel", "--tag", "batch=cli", "--yes", "--json")
        with _told_on_failure(cli):
            wait_until(
                lambda: (a := _actions(store).get("cancel")) and a[0]["done"] >= PAGE and _blocked(cluster),
                timeout=60,
                what="the command's second page waiting, its first committed",
            )
        cluster.pg_ctl("restart", "fast")
    back = time.monotonic()
    store.pool.check()  # the drill's own idle connections went with the server
    with _told_on_failure(cli):
        out, err = cli.communicate(timeout=120)
    took = round(time.monotonic() - back, 2)
    assert cli.returncode == 0, err
    assert _counts(json.loads(out)) == ("completed", RUNS, RUNS, 0, 0)
    assert "the database is unavailable" in err, err
    assert "goes on where it stopped" in err, err
    assert "the database answers again" in err, err
    assert f"{PAGE}/{RUNS} runs: {PAGE} done" in err, err  # its progress, before and after
    assert f"{RUNS}/{RUNS} runs: {RUNS} done" in err, err
    assert err.count('"event": "database_unavailable"') == 1, err  # its log: one warning
    assert "Traceback" not in err, err
    cancels = retrying(lambda: _events(store, ev.RUN_CANCEL_REQUESTED))
    assert [cancels.get(ev.run_stream(r), 0) for r in runs] == [1] * RUNS, "each run cancelled once"
    assert sum(cancels.values()) == 2 * RUNS, "no other run cancelled (the old runs were, before)"
    return took


def _serve_through_a_stop(cluster: Cluster, store: EventStore, log: Path) -> dict[str, float]:
    """An API bulk pause and a retention pass in `ledgerflow serve`, each in its second page when the
    server stops (immediate); while it is down, a command and the API answer that it is; once it is
    started again, both finish by themselves. How long the answers and the finish took."""
    took: dict[str, float] = {}
    kept = RunFilter(tags=(("batch", "keep"),))
    holds = [
        _second_page_run(store, RunFilter(tags=(("batch", "api"),))),
        _second_page_run(store, RunFilter(workflow="linear", statuses=("cancelled",))),
        uuid.UUID(str(search_runs(store, tenant="default", filter=kept, limit=1).runs[0]["run_id"])),
    ]
    _, token = create_token(store, tenant="default", scopes=["admin"], name="drill", server_admin=True)
    port = free_port()
    auth = {"Authorization": f"Bearer {token}"}
    serve: subprocess.Popen[bytes] | None = None
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=120) as client:
            with _stream_held(cluster, holds):  # before the server starts: its retention role passes at once
                serve = _serve(cluster, port, log)
                wait_until(lambda: healthy(client), timeout=60, what="serve to answer")
                asked = client.post("/api/v1/runs/bulk/pause", json={"tag": ["batch=api"]})
                assert asked.status_code == 202, asked.text
                # And a command that will not wait long: its first page in flight when the server stops.
                impatient = _cli(cluster, *CANCEL_KEPT, LEDGERFLOW_OUTAGE_WAIT="1")
                with _told_on_failure(impatient):
                    wait_until(
                        lambda: (
                            (a := _actions(store)).get("pause")
                            and a.get("release")
                            and a["pause"][0]["done"] >= PAGE
                            and a["release"][0]["done"] >= PAGE
                            # Counted apart: a third session of the server's waiting is not the command's.
                            and _blocked(cluster, "ledgerflow-serve") >= 2
                            and _blocked(cluster, "ledgerflow") >= 1
                        ),
                        timeout=60,
                        what="the API's and the retention pass's second pages waiting, their first "
                        "committed, and the command's first",
                    )
                cluster.pg_ctl("stop", "immediate")
            try:
                # 3. While it is down, a command and the API's answers, at once: typed, saying what to do.
                began = time.monotonic()
                refused = _cli(cluster, *CANCEL_KEPT)

                def cli_answers() -> None:
                    refused.wait(timeout=60)
                    took["cli_answer_while_down"] = round(time.monotonic() - began, 2)

                cli_answered = threading.Thread(target=cli_answers)
                cli_answered.start()
                answer = client.post("/api/v1/runs/bulk/cancel", json={"tag": ["batch=keep"]})
                took["api_answer_while_down"] = round(time.monotonic() - began, 2)
                shown = client.get(f"/api/v1/runs/bulk/{asked.json()['id']}")
                cli_answered.join(60)
                _, said = refused.communicate(timeout=10)
                _, gave_up = impatient.communicate(timeout=60)
                took["cli_gave_up_while_down"] = round(time.monotonic() - began, 2)
            finally:
                cluster.pg_ctl("start")
            back = time.monotonic()
            store.pool.check()
            assert _unavailable(answer) == (503, "database_unavailable"), answer.text
            assert _unavailable(shown) == (503, "database_unavailable"), shown.text
            assert refused.returncode == 1, said
            assert "cannot use the database" in said, said
            assert "Traceback" not in said, said
            assert impatient.returncode == 1, gave_up
            assert "the database is unavailable" in gave_up, gave_up
            assert "stayed unavailable for 1s" in gave_up, gave_up
            assert "stopped at 0/3 runs: run `ledgerflow workflows bulk continue" in gave_up, gave_up
            assert "the server stopped or restarted" in gave_up, gave_up  # the error's own advice
            assert "Traceback" not in gave_up, gave_up
            # Finished: the API's action, and the retention role's tick (the first, which the outage
            # stopped, logged none).
            wait_until(
                lambda: (
                    once(lambda: _actions(store)["pause"][0]["state"] != "running")
                    and '"retention_tick"' in log.read_text()
                ),
                timeout=120,
                what="the API's action and the retention pass to finish",
            )
            took["serve_after_restart"] = round(time.monotonic() - back, 2)
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=60)
    assert serve is not None
    settled = retrying(lambda: _actions(store))
    (pause,) = settled["pause"]
    assert _counts(pause) == ("completed", RUNS, RUNS, 0, 0)
    first, *later = settled["release"]
    assert _counts(first) == ("completed", 2 * RUNS, 2 * RUNS, 0, 0), first
    # A pass after it finds the runs it released still in the tables (no projector here): it skips them.
    assert all(r["state"] == "completed" and r["done"] == r["failed"] == 0 for r in later), later
    # The command that gave up left its action where it stopped: `bulk continue` (here, in-process) ends it.
    (stopped,) = [a for a in settled["cancel"] if a["state"] == "running"]
    ended = run_bulk_action(Engine(store, registry), stopped["id"], tenant="default")
    assert (ended.state, ended.done, ended.skipped) == ("completed", 3, 0)

    text = log.read_text(errors="replace")
    assert serve.returncode == 0, text[-4000:]
    assert "Traceback" not in text, text[-6000:]
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    warned = [e for e in events if e.get("event") == "database_unavailable"]
    assert len([e for e in warned if e.get("bulk_id") == str(pause["id"])]) == 1, "the API's job warned, once"
    assert len([e for e in warned if e.get("role") == "retention"]) == 1, "the retention role warned, once"
    return took

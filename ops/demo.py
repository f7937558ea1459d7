"""`ledgerflow demo`: the extraction pipeline on a real worker process, with live per-node progress.

The demo starts a projector (in this process, keeping the run and node tables) and a workflow worker
(a separate process, so it can really die). When column enrichment reaches the chosen item it kills the
worker with SIGKILL and starts a new one under the same name, which takes its nodes back at once. The
run then resumes at the next unfinished item: finished items and their LLM calls are not paid again.

Then the log takes over: the demo appends an `OntologyExtracted` event, whose trigger starts a review run;
the review waits for a person's approval, holding no worker, and the demo sends it after a pause.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.live import Live
from rich.table import Table

from eventstore import EventStore, NewEvent, open_store
from ops.cli.common import ICONS, console
from ops.settings import Settings
from ops.telemetry import configure_logging
from projector import ProjectorWorker, WorkerSettings, load_projections
from workflows import (
    NODE_CHECKPOINT,
    NODE_RECLAIMED,
    ONTOLOGY_EXTRACTED,
    STEP_RECORDED,
    Engine,
    run_nodes,
    run_started_by,
    run_stream,
    sample_schema,
    workflow_tables,
)
from workflows import demo_registry as registry

CRASH_NODE = "column_enrichment"


def start_worker(url: str, llm_delay: float, log_path: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "LEDGERFLOW_DATABASE_URL": url,
        "LEDGERFLOW_WORKFLOWS": "workflows.demo:registry",
        "LEDGERFLOW_DEMO_LLM_DELAY": str(llm_delay),
        "LEDGERFLOW_LOG_FORMAT": "json",
    }
    with log_path.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "worker", "--name", "demo-worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def node_table(nodes: list[dict[str, Any]], title: str) -> Table:
    table = Table("", "node", "status", "attempt", "progress", "message", title=title, title_justify="left")
    for n in nodes:
        progress = f"{n['progress_current']}/{n['progress_total']}" if n["progress_total"] else ""
        message = n["error"] or n["progress_message"] or ""
        table.add_row(
            ICONS.get(n["status"], "?"),
            n["node"],
            n["status"],
            str(n["attempt"] or ""),
            progress,
            message[:60],
        )
    return table


def run_demo(
    settings: Settings, *, tables: int, llm_delay: float, crash_at: int, approve_after: float = 2.0
) -> None:
    if settings.log_level == "info":
        # The live table is the demo's output; routine info logs would scroll it away.
        configure_logging("warning", settings.log_format)
    log_path = Path(tempfile.gettempdir()) / f"ledgerflow-demo-{os.getpid()}.log"
    with open_store(settings) as store:
        console.print(f"database: {store.url.split('?')[0]} · worker log: {log_path}", highlight=False)
        projector = ProjectorWorker(
            store,
            [*load_projections(settings.projection_paths), workflow_tables],
            WorkerSettings(poll_interval=0.2),
        )
        projector.prepare()
        projecting = threading.Thread(target=projector.run, daemon=True)
        projecting.start()
        worker = start_worker(store.url, llm_delay, log_path)
        try:
            run_id = _drive(
                store, worker, llm_delay, log_path, tables, crash_at, lambda w: setattr(_state, "worker", w)
            )
            if run_id is not None:
                _review(store, run_id, approve_after=approve_after)
        finally:
            current = getattr(_state, "worker", worker)
            current.send_signal(signal.SIGTERM)
            current.wait(timeout=30)
            projector.stop()
            projecting.join(timeout=30)


class _State:
    worker: subprocess.Popen[bytes]


_state = _State()
_IN_FLIGHT = ("running", "ready", "pending", "retry_scheduled")
_CATCH_UP_WAIT = 10.0  # seconds; the projector is in this process and usually takes milliseconds


def _drive(
    store: EventStore,
    worker: subprocess.Popen[bytes],
    llm_delay: float,
    log_path: Path,
    tables: int,
    crash_at: int,
    replace: Callable[[subprocess.Popen[bytes]], None],
) -> uuid.UUID | None:
    """The extraction run, shown live; its id if it succeeded."""
    engine = Engine(store, registry)
    started = engine.start(
        "ontology_extraction", input=sample_schema(tables), key=f"demo-{uuid.uuid4().hex[:8]}"
    )
    run_id = started.run_id
    console.print(f"started run {run_id}; nodes run on worker pid {worker.pid}", highlight=False)
    began = time.monotonic()
    crashed_at: int | None = None
    notes: list[str] = []
    replace(worker)
    with Live(console=console, refresh_per_second=8, transient=False) as live:
        while True:
            run = engine.load(run_id)
            nodes = run_nodes(store, run_id)
            live.update(
                node_table(nodes, f"ontology_extraction · {run.status} · {time.monotonic() - began:.1f}s")
            )
            target = run.node(CRASH_NODE)
            done_items = len(target.checkpoints)
            if crash_at and crashed_at is None and done_items >= crash_at and target.status == "running":
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                crashed_at = done_items
                notes.append(
                    f"killed worker pid {worker.pid} (SIGKILL) in {CRASH_NODE}, at item {done_items + 1} "
                    f"of {tables}"
                )
                worker = start_worker(store.url, llm_delay, log_path)
                replace(worker)
                notes.append(
                    f"started a new worker, pid {worker.pid}, under the same name: it takes the "
                    "node back at once"
                )
            if not run.active:
                break
            time.sleep(0.15)  # screen refresh interval
        # The table is the projection, which trails the log: show it once it has the run's end too, so
        # that no node of a finished run still shows as running.
        ended = time.monotonic()
        nodes = run_nodes(store, run_id)
        while any(n["status"] in _IN_FLIGHT for n in nodes) and time.monotonic() < ended + _CATCH_UP_WAIT:
            time.sleep(0.05)
            nodes = run_nodes(store, run_id)
        live.update(node_table(nodes, f"ontology_extraction · {run.status} · {ended - began:.1f}s"))
    console.print()
    for note in notes:
        console.print(f"• {note}", highlight=False)
    events = store.read_stream(run_stream(run_id), limit=100_000)
    steps = sum(e.type == STEP_RECORDED for e in events)
    reclaims = [e for e in events if e.type == NODE_RECLAIMED]
    if crashed_at is not None:
        # From the log: the items the killed attempt finished, and where the next attempt began.
        checkpoints = [e for e in events if e.type == NODE_CHECKPOINT and e.data["node"] == CRASH_NODE]
        finished = sum(e.data["attempt"] == 1 for e in checkpoints)
        console.print(
            f"• {CRASH_NODE} resumed at item {finished + 1} of {tables}, not at 1: the {finished} items "
            f"finished before the crash and their LLM calls were not paid again "
            f"({len(reclaims)} reclaim{'s' if len(reclaims) != 1 else ''} recorded)",
            highlight=False,
        )
    console.print(
        f"run {run.status} in {time.monotonic() - began:.1f}s · {len(events)} events · "
        f"{steps} LLM results recorded; a recorded call is never made again",
        highlight=False,
    )
    console.print(f"inspect it: ledgerflow workflows show {run_id}", highlight=False)
    # The console draws a run's DAG from the workflow's definition, which it finds in the registries that
    # `serve` imports: without the demo's registry it shows the run's nodes but no graph.
    console.print(
        "see its DAG in the console: LEDGERFLOW_WORKFLOWS=workflows.demo:registry ledgerflow serve, then "
        f"open http://127.0.0.1:8000/console/#/runs/{run_id} with the administrator's token it prints",
        highlight=False,
    )
    return run_id if run.status == "succeeded" else None


_REVIEW_WAIT = 60.0  # seconds for the trigger to start the review, and for each of its steps


def _review(store: EventStore, extraction_run: uuid.UUID, *, approve_after: float) -> None:
    """The second act: an event of the log starts a run, which waits for a person's approval."""
    engine = Engine(store, registry)
    console.print()
    stream = f"ontology-{extraction_run.hex[:12]}"
    entities = len(engine.load(extraction_run).node("entity_discovery").output["entities"])
    extracted = NewEvent(ONTOLOGY_EXTRACTED, {"run_id": str(extraction_run), "entities": entities})
    cursor = store.append(stream, [extracted]).events[0]
    console.print(
        f"• appended {ONTOLOGY_EXTRACTED} to {stream} (cursor {cursor.transaction_id}:{cursor.position}); "
        "the ontology_review workflow's trigger starts one run for it",
        highlight=False,
    )
    review_id = _wait_for(lambda: _triggered_run(store, extracted.event_id), "the trigger to start")
    console.print(f"• the trigger started review run {review_id}", highlight=False)
    began = time.monotonic()

    def waiting() -> bool:
        node = engine.load(review_id).node("approval")
        return node.status == "waiting" and node.waiting_for == "approve"

    _wait_for(lambda: waiting() or None, "the review to wait for its approval")
    console.print(
        f"• its approval node waits for signal 'approve', holding no worker; a reviewer answers in "
        f"{approve_after:g}s, as `ledgerflow workflows signal {review_id} approve --data "
        """'{"approved": true}'` would""",
        highlight=False,
    )
    time.sleep(approve_after)  # the reviewer reading the draft
    engine.signal(
        review_id, "approve", {"approved": True, "by": "demo reviewer"}, idempotency_key="demo-approval"
    )
    _wait_for(lambda: None if engine.load(review_id).active else True, "the review to finish")
    run = engine.load(review_id)
    console.print(
        f"review run {run.status} in {time.monotonic() - began:.1f}s after its start: "
        f"{run.node('approval').output}",
        highlight=False,
    )


def _triggered_run(store: EventStore, event_id: uuid.UUID) -> uuid.UUID | None:
    with store.connection() as conn:
        return run_started_by(conn, "ontology_review", event_id)


T = TypeVar("T")


def _wait_for(check: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + _REVIEW_WAIT
    while (found := check()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {_REVIEW_WAIT:g}s; see the worker log")
        time.sleep(0.1)
    return found

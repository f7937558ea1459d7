"""Testing workflows: a worker in the test's own process and a wait for a run's end.

    with running_worker(engine, registry):
        run_id = engine.start("summarise", input={"docs": ["a"]}).run_id
        run = wait_for_run(engine, run_id)
    assert run.status == "succeeded"
    assert run.node("summarise").output == ["summary of a"]

The worker is a real one (leases, fencing, the same SQL as in production), on a thread with short
intervals, so a test runs in about the time its nodes take. It needs a database of its own: see the
documentation's "Testing workflows" page for a fixture that makes one per test session.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from workflows.engine import Engine
from workflows.run_state import RunState
from workflows.worker import WorkflowWorker
from workflows.worker_settings import WorkerSettings
from workflows.workflow_registry import WorkflowRegistry

#: Settings for a worker inside a test: quick to find work and quick to stop.
TEST_SETTINGS = WorkerSettings(
    concurrency=4,
    lease_ttl=10.0,
    heartbeat_interval=1.0,
    recovery_interval=0.5,
    poll_interval=0.05,
    shutdown_grace=2.0,
    shutdown_database_timeout=2.0,
)
_STOP_TIMEOUT = 15.0
_POLL = 0.02


@contextmanager
def running_worker(
    engine: Engine,
    registry: WorkflowRegistry,
    settings: WorkerSettings = TEST_SETTINGS,
    *,
    name: str = "test-worker",
) -> Iterator[WorkflowWorker]:
    """A workflow worker running on a thread for the duration of the block; stopped (and joined) at its
    end, also when the block raises."""
    worker = WorkflowWorker(engine, registry, settings, name=name)
    thread = threading.Thread(target=worker.run, name=f"ledgerflow-{name}", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=_STOP_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError(f"worker {name} did not stop within {_STOP_TIMEOUT:g}s: a node ignores stops")


def wait_for_run(
    engine: Engine,
    run_id: uuid.UUID,
    *,
    tenant: str = "default",
    timeout: float = 30.0,
    follow: bool = False,
) -> RunState:
    """The run once it has ended (succeeded, failed, cancelled or continued), read from its stream; with
    `follow`, the last run of its continue_as_new chain once that has ended (one `timeout` for the chain).
    Raises TimeoutError after `timeout` seconds, naming each node's status, so a stuck test says where."""
    deadline = time.monotonic() + timeout
    while True:
        run = engine.load(run_id, tenant=tenant)
        if follow and run.continued_as is not None:
            run_id = uuid.UUID(run.continued_as)
            continue
        if not run.active:
            return run
        if time.monotonic() > deadline:
            nodes = ", ".join(f"{name}={node.status}" for name, node in run.nodes.items())
            raise TimeoutError(f"run {run_id} did not end within {timeout:g}s; its nodes: {nodes}")
        time.sleep(_POLL)  # the run's stream is the truth; a test's wait may poll it


__all__ = ["TEST_SETTINGS", "running_worker", "wait_for_run"]

"""A worker told to stop exits even when a node body never returns.

After its grace period a stopping worker hands back the nodes still running (their leases fenced, as
after a crash), but a body blocked for ever (a call to a server that died under it, say) keeps its
thread, and the interpreter waits for every such thread at exit: the process outlived its SIGTERM. It
must exit, say which thread it left behind, and the node must be finished by another worker.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from eventstore import EventStore
from tests.acceptance.drill_workers import kill, start_worker
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry

registry = WorkflowRegistry()
stuck = Workflow("stuck_once")

#: Set in a worker's environment: its body blocks for ever instead of returning.
_BLOCK_ENV = "STUCK_BODY_BLOCKS"


@stuck.node()
def call(ctx: NodeContext) -> Any:
    if os.environ.get(_BLOCK_ENV) == "1":
        threading.Event().wait()  # never returns, never reaches a context call
    return {"done_by": os.getpid()}


registry.register(stuck)

WORKFLOWS = "tests.acceptance.test_stuck_body_exit:registry"


def test_a_stopped_worker_exits_past_a_stuck_body_and_the_node_is_finished_elsewhere(
    store: EventStore, tmp_path: Path
) -> None:
    engine = Engine(store, registry)
    log = tmp_path / "worker.log"
    blocked = start_worker(
        store.url,
        "stuck-a",
        log,
        lease_ttl=2.0,
        workflows=WORKFLOWS,
        env={_BLOCK_ENV: "1", "LEDGERFLOW_WORKER_SHUTDOWN_GRACE": "1"},
    )
    finisher = None
    try:
        run_id = engine.start("stuck_once", input={}).run_id
        wait_until(
            lambda: engine.load(run_id).nodes["call"].status == "running", timeout=30, what="the claim"
        )
        blocked.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = blocked.wait(timeout=30)
        exited_after = time.monotonic() - sent
        assert code == 0, log.read_text()[-3000:]
        # grace (1 s) + hand-back + the 2 s it waits for threads to end; not the body's "for ever".
        assert exited_after < 15, f"exited {exited_after:.1f} s after SIGTERM"
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        left = [x for x in lines if x.get("event") == "process_exiting_past_stuck_threads"]
        assert len(left) == 1, lines[-5:]
        assert left[0]["threads"], left
        stopped = next(x for x in lines if x.get("event") == "workflow_worker_stopped")
        assert stopped["released"] == 1, stopped

        finisher = start_worker(store.url, "stuck-b", log, lease_ttl=2.0, workflows=WORKFLOWS)
        wait_until(lambda: not engine.load(run_id).active, timeout=30, what="the run to finish")
        run = engine.load(run_id)
        assert run.status == "succeeded", run.error
        assert run.nodes["call"].output == {"done_by": finisher.pid}
    finally:
        for p in (blocked, finisher):
            if p is not None and p.poll() is None:
                kill(p)

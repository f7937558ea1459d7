"""A node that the database keeps interrupting while the worker's pool still answers (its body needs a
connection the server refuses for want of a slot) is not claimed again in a tight loop: each
interruption in a row pushes the worker's next claim back, with jitter, and a node that ends normally
resets that (workflows.interrupts)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from eventstore import EventStore
from tests.waiting import wait_until
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry
from workflows.interrupts import InterruptBackoff
from workflows.testing import running_worker, wait_for_run

registry = WorkflowRegistry()
refused = Workflow("refused")
slots_free = threading.Event()
calls: list[int] = []
#: What a server with no free slot answers a connection attempt (libpq gives it no SQLSTATE).
FULL = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  remaining '
    "connection slots are reserved for non-replication superuser connections"
)


@refused.node()
def needs_a_connection(ctx: NodeContext) -> Any:
    calls.append(ctx.attempt)
    if not slots_free.is_set():
        raise psycopg.OperationalError(FULL)
    return "done"


registry.register(refused)

#: How long the test watches the refused node; without back-off it is claimed hundreds of times meanwhile.
WATCH = 3.0
#: Back-off against a full server: waits drawn from 0-0.5 s, 0-1 s, 0-2 s, 0-4 s, ...: 4-5 in WATCH (without
#: it, 20 at least: each claim, run and hand-back in turn).
AT_MOST = 10


def test_a_node_refused_a_connection_is_not_claimed_in_a_tight_loop(store: EventStore) -> None:
    engine = Engine(store, registry)
    slots_free.clear()
    calls.clear()
    with running_worker(engine, registry) as worker:
        run = engine.start("refused")
        threading.Event().wait(WATCH)  # a window of time to count claims in, not a synchronisation
        during = len(calls)
        assert 1 <= during <= AT_MOST, f"the node ran {during} times in {WATCH} s against a full server"
        assert worker._interrupts.in_a_row >= 1
        slots_free.set()
        done = wait_for_run(engine, run.run_id)
        assert done.status == "succeeded"  # interruptions are no failed attempts: it was never failed
        # A node that ended resets the back-off: its thread does so once the node's end has committed,
        # which the run's status may show first.
        wait_until(lambda: worker._interrupts.in_a_row == 0, what="the back-off to be reset")
    released = [e for e in store.read_stream(f"wf-{run.run_id}") if e.type == "wf.NodeReleased"]
    assert len(released) == during


def test_back_off_grows_with_interruptions_in_a_row_and_resets() -> None:
    backoff = InterruptBackoff()
    full = psycopg.OperationalError(FULL)
    waits = [backoff.interrupted(full) for _ in range(8)]
    assert all(w >= 0 for w in waits)
    assert max(waits[5:]) <= 15.0  # capped
    assert backoff.in_a_row == 8
    backoff.progressed()
    assert backoff.in_a_row == 0
    stopping = threading.Event()
    stopping.set()
    backoff.wait(stopping)  # nothing to wait out

"""Nodes a worker starts at once all enter their bodies before any of their ends is recorded: an end costs
the worker more than a start, so otherwise the first nodes to finish would hold the last ones back from
starting (after a restart or a takeover of a thousand nodes, the last started only once nearly all the
others had ended)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from eventstore import EventStore
from tests.waiting import wait_until
from tests.worker_threads import FAST
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry, WorkflowWorker
from workflows.aio import StartedTogether

registry = WorkflowRegistry()
quick = Workflow("quick")
#: ("in" | "end", perf_counter) of the test's worker, in the order they happened.
MOMENTS: list[tuple[str, float]] = []


@quick.node()
def only(ctx: NodeContext) -> Any:
    MOMENTS.append(("in", time.perf_counter()))
    return 1


registry.register(quick)


def test_a_batch_of_claimed_nodes_all_start_before_any_of_them_ends(store: EventStore) -> None:
    MOMENTS.clear()
    engine = Engine(store, registry)
    run_ids = [engine.start("quick").run_id for _ in range(12)]
    worker = WorkflowWorker(engine, registry, dataclasses.replace(FAST, concurrency=12), name="together")
    recorded = worker.lifecycle.succeeded

    def succeeded(*args: Any, **kwargs: Any) -> Any:
        MOMENTS.append(("end", time.perf_counter()))
        return recorded(*args, **kwargs)

    worker.lifecycle.succeeded = succeeded  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: all(not engine.load(r).active for r in run_ids), what="every run to end")
    finally:
        worker.stop()
        thread.join(timeout=15)
    # The twelve were claimed by one statement and started together.
    entered = [t for what, t in MOMENTS if what == "in"]
    ended = [t for what, t in MOMENTS if what == "end"]
    assert len(entered) == len(ended) == 12
    assert max(entered) < min(ended)


def test_the_wait_ends_when_the_last_body_is_entered_or_after_its_patience() -> None:
    together = StartedTogether(2, patience=30)
    waited = threading.Thread(target=together.wait)
    together.entered()
    waited.start()
    waited.join(timeout=0.2)
    assert waited.is_alive(), "one of two entered: the end waits"
    together.entered()
    waited.join(timeout=5)
    assert not waited.is_alive()
    # A body that is never entered holds the others back for `patience` seconds at most.
    impatient = StartedTogether(2, patience=0.05)
    impatient.entered()
    began = time.monotonic()
    impatient.wait()
    assert time.monotonic() - began < 15, "held back by its 0.05 s patience, not for ever"

"""`async def` nodes: they run on the worker's event loop, apart from its threads, with the guarantees of
a sync node (fenced writes, steps paid once, durable waits, cancellation, timeouts, lease loss, stop)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from eventstore import EventStore
from tests.async_flows import create_calls_table, expected_total
from tests.async_flows import registry as flows_registry
from tests.waiting import joined, wait_until
from tests.worker_threads import FAST, StartWorker, worker_threads
from workflows import (
    AsyncNodeContext,
    Engine,
    NodeContext,
    RetryPolicy,
    WorkerSettings,
    Workflow,
    WorkflowRegistry,
)
from workflows import events as ev
from workflows.scheduler import NodeStatus

#: What the bodies did, by run id, as it happened.
CALLS: dict[str, list[str]] = {}
_lock = threading.Lock()


def _note(ctx: AsyncNodeContext | NodeContext, what: str) -> None:
    with _lock:
        CALLS.setdefault(str(ctx.run_id), []).append(what)


def _calls(run_id: uuid.UUID) -> list[str]:
    with _lock:
        return list(CALLS.get(str(run_id), []))


registry = WorkflowRegistry()

naps = Workflow("naps")


@naps.node()
async def nap(ctx: AsyncNodeContext) -> float:
    started = time.monotonic()
    await asyncio.sleep(ctx.input["seconds"])
    return time.monotonic() - started


waits = Workflow("async_waits")


@waits.node()
async def wait_node(ctx: AsyncNodeContext) -> Any:
    paid = await ctx.step("paid", lambda: _note(ctx, "paid") or "receipt")
    await ctx.sleep(0.5)  # durable: the body runs again from the start when it wakes
    _note(ctx, "woke")
    decision = await ctx.wait_for_signal("approve")
    return {"paid": paid, "decision": decision}


long_haul = Workflow("long_haul")


@long_haul.node(retry=RetryPolicy(max_attempts=1))
async def haul(ctx: AsyncNodeContext) -> str:
    """Reports progress until cancelled, or awaits without a context call (`quiet`) on its first attempt."""
    _note(ctx, f"attempt {ctx.attempt}")
    if ctx.input.get("quiet") and ctx.attempt == 1:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            _note(ctx, "interrupted")
            raise
    for i in range(ctx.input.get("rounds", 0)):
        await asyncio.sleep(0.02)
        await ctx.progress(i + 1, None, "working")
        _note(ctx, "round")
    return "hauled"


timed = Workflow("timed")


@timed.node(timeout=0.5, retry=RetryPolicy(max_attempts=1))
async def slow(ctx: AsyncNodeContext) -> str:
    await asyncio.sleep(60)
    return "never"


misuse = Workflow("misuse")


@misuse.node(retry=RetryPolicy(max_attempts=1))
def sync_body(ctx: NodeContext) -> Any:
    async def call() -> int:
        return 1

    return ctx.step("call", call)


fields = Workflow("fields")


@fields.node()
async def bound(ctx: AsyncNodeContext) -> dict[str, Any]:
    await ctx.progress(1, 1)  # made in a thread of the pool, in a copy of the body's context
    return {k: str(v) for k, v in structlog.contextvars.get_contextvars().items()}


blocking = Workflow("blocking")
#: Set by the test to let the `hold` bodies finish.
GATE = threading.Event()


@blocking.node()
def hold(ctx: NodeContext) -> str:
    _note(ctx, "holding")
    GATE.wait(30)
    return "released"


limited = Workflow("limited")
registry.limit("api", concurrency=2)
#: Bodies of `limited` inside their call now, and the most there ever were.
INSIDE = [0, 0]


@limited.node(limits=["api"])
async def call_api(ctx: AsyncNodeContext) -> str:
    with _lock:
        INSIDE[0] += 1
        INSIDE[1] = max(INSIDE)
    try:
        await asyncio.sleep(0.2)
    finally:
        with _lock:
            INSIDE[0] -= 1
    return "called"


for wf in (naps, waits, long_haul, timed, misuse, fields, blocking, limited):
    registry.register(wf)


@pytest.fixture
def start_worker(store: EventStore) -> Iterator[StartWorker]:
    with worker_threads(store, registry) as start:
        yield start
    CALLS.clear()


def _finished(engine: Engine, run_id: uuid.UUID) -> bool:
    return not engine.load(run_id).active


def _types(store: EventStore, run_id: uuid.UUID) -> list[str]:
    return [e.type for e in store.read_stream(ev.run_stream(run_id), limit=10_000)]


def test_a_workflow_of_sync_and_async_nodes_completes(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, flows_registry)
    create_calls_table(store.url)
    run_id = engine.start("async_pages", input={"items": 6}).run_id
    start_worker(registry=flows_registry)
    wait_until(lambda: _finished(engine, run_id), timeout=30)
    run = engine.load(run_id)
    assert run.status == "succeeded", run.error
    assert run.nodes["total"].output == expected_total(6)
    assert set(run.nodes["fetch"].steps) == {f"page-{i}" for i in range(6)}
    assert set(run.nodes["enrich"].checkpoints) == {str(i) for i in range(6)}


def test_two_hundred_async_nodes_wait_at_once_on_four_threads(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    runs = [engine.start("naps", input={"seconds": 1}).run_id for _ in range(200)]
    sampling = threading.Event()
    sampler = threading.Thread(target=lambda: _sample_threads(sampling), daemon=True, name="sampler")
    before = {t.name for t in threading.enumerate()} | {sampler.name}
    PEAK[:] = [len(before), before]
    sampler.start()
    started = time.monotonic()
    start_worker(settings=WorkerSettings(concurrency=4, async_concurrency=250, poll_interval=0.05))
    wait_until(lambda: all(_finished(engine, r) for r in runs), timeout=60, what="200 naps")
    elapsed = time.monotonic() - started
    sampling.set()
    joined(sampler)
    peak, named = PEAK
    loaded = engine.load_many(runs, tenant="default")
    assert all(run.status == "succeeded" for run in loaded.values())
    slept = [float(run.nodes["nap"].output) for run in loaded.values()]
    spans = [(run.nodes["nap"].started_at, run.nodes["nap"].finished_at) for run in loaded.values()]
    first_to_last = (max(f for _, f in spans) - min(s for s, _ in spans)).total_seconds()
    overlap = _overlap(spans)
    print(
        f"\n200 async nodes x asyncio.sleep(1), 4 threads: {elapsed:.2f}s from the worker's start, "
        f"{first_to_last:.2f}s from the first node's start to the last one's end, {overlap} running at once "
        f"at most; threads {len(before)} before, {peak} at peak (+{peak - len(before)}: "
        f"{', '.join(sorted(named - before))}); each slept median {statistics.median(slept):.3f}s"
    )
    assert overlap >= 150, "the nodes wait at once, not four at a time"
    # Four at a time would take 50 s; the bound leaves room for a loaded 2-core machine.
    assert elapsed < 30
    # The worker's own threads (node threads, I/O threads, its loop, presence, listeners, the trigger and
    # children projections, pools) are a few dozen at most; a thread per waiting node would be 200 more.
    assert peak - len(before) <= 50, "a thread per waiting node?"


#: The most threads seen at once, and their names.
PEAK: list[Any] = []


def _sample_threads(done: threading.Event) -> None:
    while not done.wait(0.02):
        now = threading.enumerate()
        if len(now) > PEAK[0]:
            PEAK[:] = [len(now), {t.name for t in now}]


def _overlap(spans: list[tuple[Any, Any]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    open_now = peak = 0
    for _, delta in edges:
        open_now += delta
        peak = max(peak, open_now)
    return peak


def test_steps_and_waits_of_an_async_body_are_answered_from_the_log(
    store: EventStore, start_worker: Any
) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("async_waits").run_id
    worker = start_worker()
    wait_until(lambda: engine.load(run_id).nodes["wait_node"].waiting_for == "approve", timeout=20)
    assert not worker._running, "a waiting async node holds no slot"
    engine.signal(run_id, "approve", {"ok": True})
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "succeeded", run.error
    assert run.nodes["wait_node"].output == {"paid": "receipt", "decision": {"ok": True}}
    # The body ran three times (first, after the timer, after the signal); the step was paid once.
    assert _calls(run_id).count("paid") == 1
    assert _calls(run_id).count("woke") == 2


def test_cancellation_reaches_an_async_node_at_its_next_call(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("long_haul", input={"rounds": 100_000}).run_id
    start_worker()
    wait_until(lambda: _calls(run_id).count("round") >= 5, timeout=20)
    engine.cancel(run_id)
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "cancelled"
    assert run.nodes["haul"].status == NodeStatus.CANCELLED
    assert ev.NODE_CANCELLED in _types(store, run_id)


def test_a_lost_lease_stops_an_async_body_where_it_awaits(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("long_haul", input={"quiet": True}).run_id
    start_worker()
    wait_until(lambda: "attempt 1" in _calls(run_id), timeout=20)
    with store.pool.connection() as conn:  # as if the worker had been frozen past its lease
        conn.execute(
            "UPDATE ledgerflow.workflow_queue SET lease_expires_at = clock_timestamp() WHERE run_id = %s",
            (run_id,),
        )
    lost = time.monotonic()
    wait_until(lambda: "interrupted" in _calls(run_id), timeout=40, what="the body to be stopped")
    assert time.monotonic() - lost < 30, "stopped by the next heartbeat, not by its 60 s await"
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "succeeded"
    assert run.nodes["haul"].attempt == 2, "the first attempt wrote nothing after its lease was lost"


def test_an_async_node_times_out_where_it_awaits(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("timed").run_id
    started = time.monotonic()
    start_worker()
    wait_until(lambda: _finished(engine, run_id), timeout=40)
    assert time.monotonic() - started < 30, "stopped at its 0.5 s timeout, not after its 60 s sleep"
    run = engine.load(run_id)
    assert run.status == "failed"
    assert "NodeTimeout" in (run.nodes["slow"].error or "")


@pytest.mark.parametrize("quiet", [True, False], ids=["awaiting", "calling"])
def test_a_stopping_worker_hands_back_an_async_node(
    store: EventStore, start_worker: Any, quiet: bool
) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("long_haul", input={"quiet": quiet, "rounds": 0 if quiet else 40}).run_id
    first = start_worker(name="w1")
    wait_until(lambda: "attempt 1" in _calls(run_id) and (quiet or "round" in _calls(run_id)), timeout=20)
    # A body that makes calls stops at its next one (WorkerStopping); one that awaits is cancelled where
    # it awaits once the grace period (1 s) ends.
    first.stop()
    wait_until(lambda: ev.NODE_RELEASED in _types(store, run_id), timeout=10, what="the hand-back")
    assert ("interrupted" in _calls(run_id)) == quiet
    start_worker(name="w2")
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "succeeded"
    assert run.nodes["haul"].status == NodeStatus.SUCCEEDED


def test_a_sync_step_given_a_coroutine_function_fails_the_node(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("misuse").run_id
    start_worker()
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    run = engine.load(run_id)
    assert run.status == "failed"
    assert "async def" in (run.nodes["sync_body"].error or "")


def test_an_async_body_logs_with_its_node_s_fields(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    run_id = engine.start("fields").run_id
    start_worker()
    wait_until(lambda: _finished(engine, run_id), timeout=20)
    output = engine.load(run_id).nodes["bound"].output
    assert output["run_id"] == str(run_id)
    assert output["node"] == "bound"
    assert output["attempt"] == "1"


def test_async_nodes_run_while_every_thread_is_taken(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    GATE.clear()
    held = engine.start("blocking").run_id
    start_worker(settings=dataclasses.replace(FAST, concurrency=1))
    wait_until(lambda: "holding" in _calls(held), timeout=20, what="the only thread to be taken")
    try:
        naps_ = [engine.start("naps", input={"seconds": 0.1}).run_id for _ in range(5)]
        wait_until(lambda: all(_finished(engine, r) for r in naps_), timeout=20, what="the async nodes")
        assert not _finished(engine, held), "the thread is still held"
    finally:
        GATE.set()
    wait_until(lambda: _finished(engine, held), timeout=20)
    assert engine.load(held).status == "succeeded"


def test_an_async_node_with_a_limit_holds_a_slot_of_it(store: EventStore, start_worker: Any) -> None:
    engine = Engine(store, registry)
    INSIDE[:] = [0, 0]
    runs = [engine.start("limited").run_id for _ in range(6)]
    start_worker()
    wait_until(lambda: all(_finished(engine, r) for r in runs), timeout=30)
    assert all(engine.load(r).status == "succeeded" for r in runs)
    assert INSIDE[1] == 2, "at most two at once, and two did run at once"

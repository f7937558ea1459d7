"""Workflows used by the tests (importable by worker subprocesses as `tests.flows:registry`).

Node functions record every real execution in a side table (`calls`), outside the log, so tests can
tell what ran how often: a memoized step or a completed node must not run again.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from workflows import AsyncNodeContext, NodeContext, RetryPolicy, Workflow, WorkflowRegistry

registry = WorkflowRegistry()


def record_call(ctx: NodeContext, what: str) -> None:
    """Count a real execution, in its own transaction: it stays even if the node's work is lost. On a
    connection of the worker's pool (autocommit), as a node's own database work should be: a connection
    opened apart is one the process's budget does not count, and on a server without a free slot the
    node could never run (the outage drill's tight cluster)."""
    with ctx._engine.store.pool.connection() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.calls (run_id uuid, what text, attempt int, pid int, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
        conn.execute(
            "INSERT INTO public.calls (run_id, what, attempt, pid) VALUES (%s, %s, %s, %s)",
            (ctx.run_id, what, ctx.attempt, os.getpid()),
        )


linear = Workflow("linear")


@linear.node()
def first(ctx: NodeContext) -> Any:
    record_call(ctx, "first")
    return {"n": (ctx.input or {}).get("n", 1)}


@linear.node(depends_on=["first"])
def second(ctx: NodeContext) -> Any:
    record_call(ctx, "second")
    return {"n": ctx.outputs["first"]["n"] * 2}


@linear.node(depends_on=["second"])
def third(ctx: NodeContext) -> Any:
    record_call(ctx, "third")
    return {"n": ctx.outputs["second"]["n"] + 1}


registry.register(linear)

diamond = Workflow("diamond")


@diamond.node()
def source(ctx: NodeContext) -> Any:
    return [1, 2, 3]


@diamond.node(depends_on=["source"])
def left(ctx: NodeContext) -> Any:
    return sum(ctx.outputs["source"])


@diamond.node(depends_on=["source"])
def right(ctx: NodeContext) -> Any:
    return max(ctx.outputs["source"])


@diamond.node(depends_on=["left", "right"])
def join(ctx: NodeContext) -> Any:
    return ctx.outputs["left"] + ctx.outputs["right"]


registry.register(diamond)

#: Failures to inject, per (workflow input "fail" marker): how many attempts of `flaky` fail first.
flaky_flow = Workflow("flaky")


@flaky_flow.node(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05))
def flaky(ctx: NodeContext) -> Any:
    record_call(ctx, "flaky")
    if ctx.attempt <= int((ctx.input or {}).get("fail_times", 0)):
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    return "ok"


@flaky_flow.node(depends_on=["flaky"])
def after_flaky(ctx: NodeContext) -> Any:
    record_call(ctx, "after_flaky")
    return "done"


registry.register(flaky_flow)

drill = Workflow("drill")
#: The drills SIGKILL their worker up to 12 times, each time while it holds nodes, and a restarted worker
#: takes its nodes back first: one node can be held at most of the kills. A node held at a kill counts a
#: crash, and is parked after `max_crashes` of them (a node that kills its worker is parked, not run for
#: ever); the drills prove completion and payment, so no node of theirs may be parked for their kills.
DRILL_MAX_CRASHES = 12


@drill.node(max_crashes=DRILL_MAX_CRASHES)
def prepare(ctx: NodeContext) -> Any:
    record_call(ctx, "prepare")
    return list(range(int((ctx.input or {}).get("items", 10))))


@drill.node(depends_on=["prepare"], max_crashes=DRILL_MAX_CRASHES)
def work_items(ctx: NodeContext) -> Any:
    def square(i: int) -> int:
        record_call(ctx, f"item:{i}")
        time.sleep(0.01)
        return i * i

    return sum(ctx.map(ctx.outputs["prepare"], square))


@drill.node(depends_on=["prepare"], max_crashes=DRILL_MAX_CRASHES)
def expensive(ctx: NodeContext) -> Any:
    def call() -> int:
        record_call(ctx, "step:llm")
        time.sleep(0.05)
        return 42

    first = ctx.step("llm", call)
    ctx.progress(1, 2, "between steps")
    second = ctx.step("llm-2", lambda: (record_call(ctx, "step:llm-2"), 8)[1])
    return first + second


@drill.node(depends_on=["work_items", "expensive"], max_crashes=DRILL_MAX_CRASHES)
def combine(ctx: NodeContext) -> Any:
    record_call(ctx, "combine")
    return ctx.outputs["work_items"] + ctx.outputs["expensive"]


registry.register(drill)

# -- flows steered by the in-process tests -----------------------------------------------------------

#: Events a gated node waits for, by run id (set by the test to let the node finish).
GATES: dict[str, threading.Event] = {}
#: Runs whose `resumable` node dies (as if its process were killed) after checkpointing this many items.
CRASH_AFTER: dict[str, int] = {}


class SimulatedCrash(BaseException):
    """Ends a node's thread without any clean-up, like a killed process: the lease simply lapses."""


gated = Workflow("gated")


@gated.node()
def wait_gate(ctx: NodeContext) -> Any:
    gate = GATES.setdefault(str(ctx.run_id), threading.Event())
    step = 0
    while not gate.wait(0.01):
        step += 1
        ctx.progress(step, None, "waiting at the gate")  # sees a cancellation at its next write
    return "through"


@gated.node(depends_on=["wait_gate"])
def after_gate(ctx: NodeContext) -> Any:
    record_call(ctx, "after_gate")
    return "after"


registry.register(gated)

resumable = Workflow("resumable")


@resumable.node()
def items(ctx: NodeContext) -> Any:
    paid = ctx.step("setup", lambda: (record_call(ctx, "step:setup"), "ready")[1])

    def handle(i: int) -> int:
        record_call(ctx, f"item:{i}")
        return i * 10

    def crash_check(i: int) -> int:
        result = handle(i)
        if CRASH_AFTER.get(str(ctx.run_id)) == i and ctx.attempt == 1:
            ctx.checkpoint(str(i), result)
            raise SimulatedCrash
        return result

    return {"setup": paid, "sum": sum(ctx.map(range(1, 11), crash_check))}


registry.register(resumable)

stuck_flow = Workflow("stuck")


@stuck_flow.node(progress_deadline=0.3, on_stuck="retry")
def silent_retry(ctx: NodeContext) -> Any:
    if ctx.attempt == 1:  # the first attempt hangs without reporting progress
        GATES.setdefault(f"stuck:{ctx.run_id}", threading.Event()).wait(30)
    return ctx.attempt


registry.register(stuck_flow)

stuck_fail_flow = Workflow("stuck_fail")


@stuck_fail_flow.node(progress_deadline=0.3, on_stuck="fail", retry=RetryPolicy(max_attempts=1))
def silent_fail(ctx: NodeContext) -> Any:
    GATES.setdefault(f"stuck:{ctx.run_id}", threading.Event()).wait(30)
    return "never recorded"


registry.register(stuck_fail_flow)

parent = Workflow("parent")


@parent.node(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02))
def spawn(ctx: NodeContext) -> Any:
    child = ctx.start_workflow("linear", input={"n": 2}, child_key="follow-up")
    if ctx.attempt == 1:
        raise RuntimeError("fails after starting its child")
    return str(child)


registry.register(parent)

bad_output = Workflow("bad_output")


@bad_output.node(retry=RetryPolicy(max_attempts=1))
def unrecordable(ctx: NodeContext) -> Any:
    return {"not json": object()}


registry.register(bad_output)

approval = Workflow("approval")


@approval.node()
def draft(ctx: NodeContext) -> Any:
    return ctx.step("draft", lambda: (record_call(ctx, "step:draft"), "a draft")[1])


@approval.node(depends_on=["draft"])
def review(ctx: NodeContext) -> Any:
    """Waits for a person's decision: signal `approve`, e.g. {"approved": true, "note": "..."}."""
    return ctx.wait_for_signal("approve", timeout=(ctx.input or {}).get("timeout"))


@approval.node(depends_on=["review"])
def publish(ctx: NodeContext) -> Any:
    if (ctx.input or {}).get("hold"):  # the run stays active until the test opens the gate
        GATES.setdefault(f"publish:{ctx.run_id}", threading.Event()).wait(30)
    decision = ctx.outputs["review"]
    approved = isinstance(decision, dict) and decision.get("approved") is True
    return {"published": approved, "decision": decision}


registry.register(approval)

countdown = Workflow("countdown")


@countdown.node()
def count(ctx: NodeContext) -> Any:
    """Continues as a new run with n - 1 until n is 0. With `gate`, waits (writing nothing, so it does not
    see a cancellation) until the test opens the run's gate first; with `bad`, tries a successor's input
    the engine refuses and returns the error's class name."""
    record_call(ctx, "count")
    given = ctx.input or {}
    if given.get("gate"):
        GATES.setdefault(str(ctx.run_id), threading.Event()).wait(30)
    if (bad := given.get("bad")) is not None:
        try:
            ctx.continue_as_new("x" * 2_000_000 if bad == "large" else {"not json": object()})
        except Exception as exc:
            return type(exc).__name__
    if given.get("n", 0) > 0:
        ctx.continue_as_new({**given, "n": given["n"] - 1})
    return {"done": given.get("n", 0)}


@countdown.node(depends_on=["count"])
def after_count(ctx: NodeContext) -> Any:
    return "after"


registry.register(countdown)

async_countdown = Workflow("async_countdown")


@async_countdown.node()
async def async_count(ctx: AsyncNodeContext) -> Any:
    """`countdown`'s loop in an `async def` node."""
    n = (ctx.input or {}).get("n", 0)
    if n > 0:
        ctx.continue_as_new({"n": n - 1})
    return {"done": n}


registry.register(async_countdown)

twin_countdown = Workflow("twin_countdown")


def _twin(ctx: NodeContext) -> Any:
    n = (ctx.input or {}).get("n", 0)
    if n > 0:
        ctx.continue_as_new({"n": n - 1})
    return n


@twin_countdown.node()
def twin_a(ctx: NodeContext) -> Any:
    """Continues at the same moment as `twin_b`: only one of them ends the run."""
    return _twin(ctx)


@twin_countdown.node()
def twin_b(ctx: NodeContext) -> Any:
    return _twin(ctx)


registry.register(twin_countdown)

"""Workflows whose nodes start child runs, for the tests of parent-close policies (importable by worker
subprocesses as `tests.children_flows:registry`)."""

from __future__ import annotations

import threading
from typing import Any

from workflows import NodeContext, RetryPolicy, Workflow, WorkflowRegistry

registry = WorkflowRegistry()
#: Events a `held` node waits for, by run id (set by an in-process test to let the node finish).
GATES: dict[str, threading.Event] = {}

tree = Workflow("tree")


@tree.node()
def spawn(ctx: NodeContext) -> Any:
    """Starts one child per policy in the input (each a `tree` one level less deep), then waits for the
    signal `go`, holding no worker."""
    depth = int(ctx.input["depth"])
    children = {}
    if depth > 0:
        for policy in ctx.input.get("policies", ["cancel"]):
            child = ctx.start_workflow(
                "tree", input={**ctx.input, "depth": depth - 1}, child_key=policy, parent_close=policy
            )
            children[policy] = str(child)
    ctx.wait_for_signal("go")
    return children


registry.register(tree)

held = Workflow("held")


@held.node(retry=RetryPolicy(max_attempts=1))
def hold(ctx: NodeContext) -> Any:
    """Starts one `busy` child per policy in the input, then runs until its gate opens (or it fails)."""
    for policy in ctx.input.get("policies", []):
        ctx.start_workflow("busy", input={}, child_key=policy, parent_close=policy)
    if ctx.input.get("fail"):
        raise RuntimeError("the parent fails on purpose")
    _hold(ctx)
    return "held"


busy = Workflow("busy")


@busy.node()
def work(ctx: NodeContext) -> Any:
    """Runs until its gate opens, writing progress (where it sees a cancellation, pause or lost claim)."""
    _hold(ctx)
    return "worked"


@busy.node(depends_on=["work"])
def after(ctx: NodeContext) -> Any:
    return "after"


def _hold(ctx: NodeContext) -> None:
    gate = GATES.setdefault(str(ctx.run_id), threading.Event())
    step = 0
    while not gate.wait(0.01):
        step += 1
        ctx.progress(step, None, "held at the gate")


registry.register(held)
registry.register(busy)

"""A fan-out/fan-in workflow for the console's DAG (importable as `tests.browser.console_flows:registry`).

    split ─┬─ double ──────────┐
           ├─ square ──────────┼─ merge
           └─ negate ── total ─┘

`merge` sits in the fourth layer, below `total` (the longest path from the root), not in the third.
"""

from __future__ import annotations

from typing import Any

from workflows import NodeContext, Workflow, WorkflowRegistry

registry = WorkflowRegistry()
fanout = Workflow("fanout")


@fanout.node()
def split(ctx: NodeContext) -> Any:
    return {"parts": (ctx.input or {}).get("parts", [1, 2, 3])}


@fanout.node(depends_on=["split"])
def double(ctx: NodeContext) -> Any:
    return [2 * p for p in ctx.outputs["split"]["parts"]]


@fanout.node(depends_on=["split"])
def square(ctx: NodeContext) -> Any:
    return [p * p for p in ctx.outputs["split"]["parts"]]


@fanout.node(depends_on=["split"])
def negate(ctx: NodeContext) -> Any:
    return [-p for p in ctx.outputs["split"]["parts"]]


@fanout.node(depends_on=["negate"])
def total(ctx: NodeContext) -> Any:
    return sum(ctx.outputs["negate"])


@fanout.node(depends_on=["double", "square", "total"])
def merge(ctx: NodeContext) -> Any:
    return {"double": ctx.outputs["double"], "square": ctx.outputs["square"], "total": ctx.outputs["total"]}


registry.register(fanout)

#: Every edge of `fanout`, as the console names them (dependency -> node).
FANOUT_EDGES = {
    "split->double",
    "split->square",
    "split->negate",
    "negate->total",
    "double->merge",
    "square->merge",
    "total->merge",
}

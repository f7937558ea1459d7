"""Workflows that wait, for the drills (importable by worker subprocesses as `tests.waiting_flows:registry`).

Every paid call is recorded in the `calls` side table (`tests.flows.record_call`), so a drill can tell
that no memoized step ran again after it was recorded, however often the node slept, waited and was
killed in between.
"""

from __future__ import annotations

import time
from typing import Any

from tests.flows import DRILL_MAX_CRASHES, record_call
from workflows import NodeContext, Workflow, WorkflowRegistry

registry = WorkflowRegistry()

patient = Workflow("patient")


def _polish(ctx: NodeContext, text: str) -> str:
    record_call(ctx, "step:polish")
    # A provider's latency: the drill's kills land inside this step often enough to interrupt a node.
    time.sleep(0.25)
    return text.upper()


@patient.node(max_crashes=DRILL_MAX_CRASHES)
def draft(ctx: NodeContext) -> Any:
    text = ctx.step("draft", lambda: (record_call(ctx, "step:draft"), "draft text")[1])
    ctx.sleep(float(ctx.input["nap"]))  # a provider's rate limit, say
    polished = ctx.step("polish", lambda: _polish(ctx, text))
    decision = ctx.wait_for_signal("approve")
    ctx.step("publish", lambda: record_call(ctx, "step:publish"))
    return {"text": polished, "decision": decision}


@patient.node(depends_on=["draft"], max_crashes=DRILL_MAX_CRASHES)
def archive(ctx: NodeContext) -> Any:
    record_call(ctx, "archive")
    return ctx.outputs["draft"]["decision"]


registry.register(patient)

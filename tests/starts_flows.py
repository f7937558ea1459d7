"""Workflows started by the log and by schedules, for the tests of `workflows.triggers` and
`workflows.schedules` (importable by worker subprocesses as `tests.starts_flows:triggered` and
`tests.starts_flows:scheduled`). Each node records its real executions in `public.calls`
(see tests.flows.record_call), so tests can tell that every run ran, and ran once.
"""

from __future__ import annotations

from typing import Any

from tests.flows import record_call
from workflows import NodeContext, Schedule, Trigger, Workflow, WorkflowRegistry

triggered = WorkflowRegistry()

on_order = Workflow("on_order", triggers=[Trigger("OrderPlaced", category="order")])


@on_order.node()
def take_order(ctx: NodeContext) -> Any:
    record_call(ctx, "take_order")
    return {"event_id": ctx.input["event_id"], "total": ctx.input["data"].get("total")}


triggered.register(on_order)

scheduled = WorkflowRegistry()

#: Every second, starting every missed tick after a downtime, at most 3.
every_second = Workflow("every_second", schedule=Schedule("* * * * * *", catch_up="all", max_catch_up=3))


@every_second.node()
def tick(ctx: NodeContext) -> Any:
    record_call(ctx, "tick")
    return {"tick": ctx.input["tick"]}


scheduled.register(every_second)

#: The latest missed tick only, after a downtime.
every_second_skip = Workflow("every_second_skip", schedule=Schedule("* * * * * *", catch_up="skip"))


@every_second_skip.node(name="tick")
def tick_skip(ctx: NodeContext) -> Any:
    record_call(ctx, "tick")
    return {"tick": ctx.input["tick"]}


scheduled.register(every_second_skip)

"""A one-node workflow that needs no connection of its own, for the scarce-connections drill (importable
by worker subprocesses as `tests.scarce_flows:registry`): every connection it uses is its worker's."""

from __future__ import annotations

from typing import Any

from workflows import NodeContext, Workflow, WorkflowRegistry

registry = WorkflowRegistry()

one_node = Workflow("one_node")


@one_node.node()
def only(ctx: NodeContext) -> Any:
    return {"n": (ctx.input or {}).get("n")}


registry.register(one_node)

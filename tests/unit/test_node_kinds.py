"""What a worker claims for its threads and for its event loop: never more sync nodes than free threads,
never more `async def` nodes than free places on the loop, and something whenever there is room."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from workflows import NodeContext, Workflow, WorkflowRegistry
from workflows.aio import Kinds


def test_workflows_are_sorted_by_where_their_nodes_run() -> None:
    registry = WorkflowRegistry()
    plain, awaiting, both = Workflow("plain"), Workflow("awaiting"), Workflow("both")

    @plain.node()
    def a(ctx: NodeContext) -> None: ...

    @awaiting.node()
    async def b(ctx: Any) -> None: ...

    @both.node()
    def c(ctx: NodeContext) -> None: ...

    @both.node(depends_on=["c"])
    async def d(ctx: Any) -> None: ...

    for wf in (plain, awaiting, both):
        registry.register(wf)
    kinds = Kinds.of(registry)
    assert sorted(kinds.threaded) == ["both", "plain"]
    assert kinds.on_loop == ["awaiting"]
    assert kinds.mixed
    assert kinds.any_async


@given(
    threaded=st.booleans(),
    on_loop=st.booleans(),
    mixed=st.booleans(),
    threads_free=st.integers(-3, 20),
    loop_free=st.integers(-3, 300),
)
def test_claims_never_exceed_the_room_of_either_kind(
    threaded: bool, on_loop: bool, mixed: bool, threads_free: int, loop_free: int
) -> None:
    mixed = mixed and threaded  # a mixed workflow is one with a sync node
    kinds = Kinds(threaded=["t"] if threaded else [], on_loop=["l"] if on_loop else [], mixed=mixed)
    budgets = dict((workflows[0], limit) for workflows, limit in kinds.budgets(threads_free, loop_free))
    assert all(limit > 0 for limit in budgets.values())
    for_threads, for_loop = budgets.get("t", 0), budgets.get("l", 0)
    # Sync nodes only come from the threaded workflows; async ones from both when one mixes kinds.
    assert for_threads <= max(threads_free, 0)
    assert for_loop + (for_threads if mixed else 0) <= max(loop_free, 0)
    # And room is used: whatever has room and work is claimed.
    if threaded and threads_free > 0 and (not mixed or loop_free > 0):
        assert for_threads > 0
    if on_loop and loop_free - (for_threads if mixed else 0) > 0:
        assert for_loop > 0

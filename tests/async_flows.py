"""Workflows with `async def` nodes (importable by worker subprocesses as `tests.async_flows:registry`).

Bodies record every real execution in the `calls` side table, as `tests.flows` does, but through
psycopg's async connection, so that nothing in them blocks the worker's event loop.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

from tests.flows import record_call
from workflows import AsyncNodeContext, NodeContext, Workflow, WorkflowRegistry

registry = WorkflowRegistry()


def create_calls_table(url: str) -> None:
    """Before the workers start: bodies creating it at the same moment collide in the catalogue."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.calls (run_id uuid, what text, attempt int, pid int, "
            "at timestamptz DEFAULT clock_timestamp())"
        )


async def record(ctx: AsyncNodeContext, what: str) -> None:
    """Count a real execution, in its own transaction: it stays even if the node's work is lost. The
    table is made by `create_calls_table`."""
    async with await psycopg.AsyncConnection.connect(ctx._engine.store.url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO public.calls (run_id, what, attempt, pid) VALUES (%s, %s, %s, %s)",
            (ctx.run_id, what, ctx.attempt, os.getpid()),
        )


#: A sync node, then two `async def` ones side by side (concurrent steps; checkpointed items), then a
#: sync one: the worker hands nodes between its threads and its event loop.
pages = Workflow("async_pages")


@pages.node()
def listing(ctx: NodeContext) -> list[int]:
    record_call(ctx, "listing")
    return list(range(int((ctx.input or {}).get("items", 6))))


@pages.node(depends_on=["listing"])
async def fetch(ctx: AsyncNodeContext) -> int:
    async def get(i: int) -> int:
        await record(ctx, f"step:page-{i}")
        await asyncio.sleep(0.05 * (1 + i % 3))  # the HTTP call
        return i * 10

    # Steps whose calls run at once; each result is recorded as soon as it comes.
    found = await asyncio.gather(
        *(ctx.step(f"page-{i}", lambda i=i: get(i)) for i in ctx.outputs["listing"])  # type: ignore[misc]
    )
    return sum(found)


@pages.node(depends_on=["listing"])
async def enrich(ctx: AsyncNodeContext) -> int:
    items = ctx.outputs["listing"]
    total = 0
    for index, i in enumerate(items, start=1):
        done, output = ctx.checkpointed(str(i))
        if not done:
            await record(ctx, f"item:{i}")
            await asyncio.sleep(0.03)
            output = i * i
            await ctx.checkpoint(str(i), output)
        total += output
        await ctx.progress(index, len(items))
    return total


@pages.node(depends_on=["fetch", "enrich"])
def total(ctx: NodeContext) -> int:
    record_call(ctx, "total")
    return int(ctx.outputs["fetch"]) + int(ctx.outputs["enrich"])


registry.register(pages)


def expected_total(items: int) -> int:
    return sum(i * 10 for i in range(items)) + sum(i * i for i in range(items))


#: One `async def` node that pays for a call, holds on a while (where a drill kills its worker), and
#: pays for a second one.
paid = Workflow("async_paid")


@paid.node()
async def charge(ctx: AsyncNodeContext) -> Any:
    async def pay(what: str) -> str:
        await record(ctx, f"step:{what}")
        return f"receipt:{what}"

    first = await ctx.step("charge", lambda: pay("charge"))
    await asyncio.sleep(float((ctx.input or {}).get("hold", 0.5)))
    second = await ctx.step("refund", lambda: pay("refund"))
    return [first, second]


registry.register(paid)

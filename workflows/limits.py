"""Limits per key, shared by every worker on every host: declared in code, enforced in the database.

    registry.limit("llm", concurrency=4, per_minute=60)

    @flow.node(limits=["llm"])
    def summarise(ctx): ...

A worker writes its registry's limits, and which nodes need them, when it starts (`declare`); from then
on every claim of such a node is admitted by the database (the `claim` query and
ledgerflow.wf_limits_admit, migrations/0015_workflow_limits.sql), exactly, whatever the number of
workers claiming at the same instant. A slot in use is a claimed queue row of a node with the limit, so
every way a node stops running frees it by itself. A node that waits for a slot is a ready row of the
queue, due again shortly (or, under a per-minute limit, when the oldest start in the window is a minute
old): it holds no thread and no connection, and the walk of the ready index passes it by meanwhile.

Two workers that disagree about a limit (a deploy in progress) do not fight: the last to start wins,
and it logs `workflow_limit_redeclared` with what it replaced. The same holds for the limits of a node.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg.rows import class_row

from eventstore.sqlfile import load_queries
from workflows.definition import DefinitionError, Limit, WorkflowRegistry
from workflows.errors import NodeLeaseLost, wrap_exceptions

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "limits.sql")
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class LimitUsage:
    """A limit as enforced now: its bounds, its slots in use, the nodes waiting for one."""

    name: str
    concurrency: int | None
    per_minute: int | None
    #: Nodes of this limit running now (claimed), on every worker.
    in_use: int
    #: Nodes of this limit ready to run and not yet started: waiting for a slot, or for a worker.
    waiting: int
    started_last_minute: int
    declared_by: str
    declared_at: datetime


def node_limits(registry: WorkflowRegistry) -> dict[tuple[str, str], tuple[str, ...]]:
    """Every node of the registry that needs limits, by (workflow, node). Raises DefinitionError when a
    node names a limit the registry does not declare: its bounds would be unknown."""
    needs: dict[tuple[str, str], tuple[str, ...]] = {}
    for name in registry.names():
        for spec in registry.get(name).nodes.values():
            if unknown := [k for k in spec.limits if k not in registry.limits]:
                raise DefinitionError(
                    f"workflow {name!r}: node {spec.name!r} needs limit(s) {unknown} that the registry does "
                    f'not declare; declare each with registry.limit("{unknown[0]}", concurrency=...)'
                )
            if spec.limits:
                needs[(name, spec.name)] = spec.limits
    return needs


def declare(conn: Conn, registry: WorkflowRegistry, *, worker: str) -> None:
    """Write the registry's limits and its nodes' needs, in the caller's transaction. What another worker
    declared differently is replaced, and said so in the log."""
    needs = node_limits(registry)
    limits: Mapping[str, Limit] = registry.limits
    names = sorted(limits)
    with wrap_exceptions():
        before = conn.execute(Q["declared_limits"], {"names": names}).fetchall()
        for name, concurrency, per_minute, declared_by in before:
            mine = limits[name]
            if (concurrency, per_minute) != (mine.concurrency, mine.per_minute):
                log.warning(
                    "workflow_limit_redeclared",
                    limit=name,
                    concurrency=mine.concurrency,
                    per_minute=mine.per_minute,
                    replaced_concurrency=concurrency,
                    replaced_per_minute=per_minute,
                    replaced_worker=declared_by,
                )
        if names:
            conn.execute(
                Q["declare_limits"],
                {
                    "worker": worker,
                    "names": names,
                    "concurrency": [limits[n].concurrency for n in names],
                    "per_minute": [limits[n].per_minute for n in names],
                },
            )
        conn.execute(
            Q["declare_node_limits"],
            {
                "all_workflows": registry.names(),
                "workflows": [w for w, _ in needs],
                "nodes": [n for _, n in needs],
                "limits": [",".join(k) for k in needs.values()],
            },
        )
    if names:
        log.info("workflow_limits_declared", limits=names, nodes=len(needs), worker=worker)


def usage(conn: Conn) -> list[LimitUsage]:
    """Every declared limit with its use now, by name."""
    with wrap_exceptions(), conn.cursor(row_factory=class_row(LimitUsage)) as cur:
        return cur.execute(Q["usage"]).fetchall()


def read_usage(pool: Any) -> list[LimitUsage]:
    """`usage` on a connection of `pool` (a store's pool), for readers outside a transaction."""
    with pool.connection() as conn:
        return usage(conn)


def holds_claim(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    with wrap_exceptions():
        row = conn.execute(Q["holds_claim"], {"run_id": run_id, "node": node, "token": token}).fetchone()
    return bool(row and row[0])


def check_slots(ctx: Any) -> None:
    """Before the body of a node with limits runs: its claim must hold the node. A claim made by the
    claim query was admitted; a successor handed to the worker at its predecessor's end may have been
    refused a slot, and is then a ready row waiting for one, which this worker must leave alone: it
    raises NodeLeaseLost, and the worker lets go of the node without writing anything."""
    claim = ctx._claim  # the node's own claim: the context is this package's
    with ctx._engine.store.pool.connection() as conn:
        held = holds_claim(conn, claim.run_id, claim.node, claim.token)
    if not held:
        log.info("workflow_node_waits_for_slot", run_id=str(claim.run_id), node=claim.node)
        raise NodeLeaseLost(
            f"run {claim.run_id}: node {claim.node!r} got no slot of its limits when handed over; "
            "it waits, ready, for one"
        )

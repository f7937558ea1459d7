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

A node's successor handed to the worker that ends the node (see workflows/node_end_writes.py) is admitted in
the same way, by ledgerflow.wf_end_node; refused, it is queued ready instead, and the worker that
expected it finds at its start that it holds no claim (`check_slots`) and lets it go. A step can need
slots too (`ctx.step(key, fn, limits=[...])`, `step_slots`): a row holds each from its admission until
the step's result is recorded (migrations/0018_workflow_step_limits.sql).

Two workers that disagree about a limit (a deploy in progress) do not fight: the last to start wins,
and it logs `workflow_limit_redeclared` with what it replaced. The same holds for the limits of a node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import structlog
from psycopg.rows import class_row

from eventstore import InvalidInputError
from eventstore.spi import fetch_one, fetch_value, load_queries
from workflows.definition_checks import DefinitionError
from workflows.errors import NodeLeaseLost, NodeSuspended, wrap_exceptions
from workflows.workflow_registry import Limit, WorkflowRegistry

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "limits.sql")
Conn = psycopg.Connection[Any]
_STEP_FIRST_WAIT = 0.2  # seconds a step refused a slot first waits; doubled at each refusal after
_STEP_LONGEST_WAIT = 5.0


@dataclass(frozen=True)
class LimitUsage:
    """A limit as enforced now: its bounds, its slots in use, the nodes waiting for one."""

    name: str
    concurrency: int | None
    per_minute: int | None
    #: Slots in use now, on every worker: nodes of this limit running, and steps holding one.
    in_use: int
    #: Nodes of this limit ready to run and not yet started: waiting for a slot, or for a worker.
    waiting: int
    started_last_minute: int
    declared_by: str
    declared_at: datetime


def node_limits(registry: WorkflowRegistry) -> dict[tuple[str, str], tuple[str, ...]]:
    """Every node of the registry that needs limits, by (workflow, node). The queue knows a node by its
    workflow and name: a node that needs limits in any version of its workflow needs them in every one
    (the union, so that no version runs unbounded). Raises DefinitionError when a node names a limit the
    registry does not declare: its bounds would be unknown."""
    needs: dict[tuple[str, str], tuple[str, ...]] = {}
    for wf in registry.definitions():
        for spec in wf.nodes.values():
            if unknown := [k for k in spec.limits if k not in registry.limits]:
                raise DefinitionError(
                    f"workflow {wf.name!r}: node {spec.name!r} needs limit(s) {unknown} that the registry "
                    f'does not declare; declare each with registry.limit("{unknown[0]}", concurrency=...)'
                )
            if spec.limits:
                known = needs.get((wf.name, spec.name), ())
                needs[(wf.name, spec.name)] = known + tuple(k for k in spec.limits if k not in known)
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
    with wrap_exceptions(), pool.connection() as conn:
        return usage(conn)


def holds_claim(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    with wrap_exceptions():
        held = fetch_value(conn, Q["holds_claim"], {"run_id": run_id, "node": node, "token": token})
    return bool(held)


@contextmanager
def step_slots(ctx: Any, key: str, needed: Sequence[str]) -> Iterator[None]:
    """Around a step's `fn` and the recording of its result: a slot of each limit in `needed` (those the
    node itself does not already hold), held by a row of the database until the step ends, or its
    node's claim does. While one is full, the node suspends itself (NodeSuspended: no thread, no
    connection held) and, woken, runs its body again up to this step, which asks again. Woken again and
    again by a concurrency limit, it waits longer each time (0.2 s doubling up to 5 s); under a per-minute
    limit it wakes when the window has room."""
    if isinstance(needed, str):
        raise InvalidInputError(f"step {key!r}: limits must be a list of limit names, not {needed!r}")
    keys = sorted(set(needed) - set(ctx._spec.limits))
    if unknown := [k for k in keys if k not in ctx._engine.registry.limits]:
        raise InvalidInputError(f"step {key!r} needs limit(s) {unknown} that the registry does not declare")
    if not keys:
        yield
        return
    ctx.check()
    claim = ctx._claim  # the node's own claim: the context is this package's
    held = {"run_id": claim.run_id, "node": claim.node, "token": claim.token, "keys": keys}
    with wrap_exceptions(), ctx._engine.store.pool.connection() as conn:
        hold = fetch_one(conn, _Hold, Q["hold_slots"], held)
    assert hold is not None  # the function answers one row
    admitted, wake_at = hold.admitted, hold.wake_at
    if not admitted:
        waited = sum(1 for k in ctx._state.waits if k.startswith(f"limit:{key}#"))
        backoff = timedelta(seconds=min(_STEP_FIRST_WAIT * 2**waited, _STEP_LONGEST_WAIT))
        until = max(wake_at, datetime.now(UTC) + backoff)
        log.info("workflow_step_waits_for_slot", step=key, limits=keys, until=until.isoformat())
        raise NodeSuspended(f"limit:{key}#{waited + 1}", until)
    try:
        yield
    finally:
        try:
            with wrap_exceptions(), ctx._engine.store.pool.connection() as conn:
                conn.execute(Q["release_slots"], held)
        except Exception as exc:  # the hold stops counting when the node's claim ends
            log.warning("workflow_step_slots_not_released", step=key, error=str(exc))


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


@dataclass(frozen=True, slots=True)
class _Hold:
    """A row of hold_slots (ledgerflow.wf_limits_hold): whether the node was admitted, and else when the
    slot it waits for may be free."""

    admitted: bool
    wake_at: datetime

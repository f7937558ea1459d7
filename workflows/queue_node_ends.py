"""The queue's side of a node's end: the fence that proves the claim still holds, the node's row gone,
ready again or waiting, its successors queued (and one claimed by the same worker), in one statement
beside the run-stream append that records the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import kwargs_row, scalar_row

from eventstore.spi import IntArray, TextArray, fetch_all, sent, synced
from workflows.node_spec import NodeSpec
from workflows.queries import Q
from workflows.queue_claims import Claim, Claimant
from workflows.queue_end_rows import NodeEnded, NodeEndRow, RunEnded, RunEndRow
from workflows.queue_enqueue import node_row_params

Conn = psycopg.Connection[Any]


def fence(conn: Conn, run_id: uuid.UUID, node: str, token: int, *, check_cancel: bool = True) -> None:
    conn.execute(Q["fence"], {"run_id": run_id, "node": node, "token": token, "check_cancel": check_cancel})


def fence_at(
    conn: Conn, run_id: uuid.UUID, node: str, token: int, *, check_cancel: bool = True
) -> Callable[[], datetime]:
    """`fence`, sent without waiting for its answer (in a pipeline); the returned call gives the
    transaction's timestamp, the recorded_at of events appended with it."""
    params = {"run_id": run_id, "node": node, "token": token, "check_cancel": check_cancel}
    cursor: psycopg.Cursor[datetime] = sent(conn, scalar_row, Q["fence_at"], params)

    def recorded_at() -> datetime:
        at = synced(cursor).fetchone()
        assert at is not None
        return at

    return recorded_at


@dataclass(frozen=True)
class Successor:
    """A newly runnable node that the finishing worker claims for itself with `token`."""

    claimant: Claimant
    token: int


def end_node(
    conn: Conn,
    claim: Claim,
    *,
    retry_in: float | None = None,
    ready: Sequence[NodeSpec] = (),
    attempts: Mapping[str, int] | None = None,
    successor: Successor | None = None,
    check_cancel: bool = False,
) -> Callable[[], NodeEnded]:
    """Every queue change of a node's end in one statement (see ledgerflow.wf_end_node): the fence, the
    node's row gone (or ready again after `retry_in` seconds), the `ready` nodes queued, the first of them
    claimed by `successor`. Sent without waiting for its answer, so that the run-stream append follows it
    in the same round trip; the returned call gives the outcome once the answer is in."""
    params = _end_params(claim, retry_in, ready, attempts, successor, check_cancel)
    cursor = sent(conn, kwargs_row(NodeEnded), Q["end_node"], params)

    def outcome() -> NodeEnded:
        ended = synced(cursor).fetchone()
        assert ended is not None
        return ended

    return outcome


def record_node_end(
    conn: Conn,
    claim: Claim,
    append: Mapping[str, Any],
    *,
    retry_in: float | None = None,
    ready: Sequence[NodeSpec] = (),
    attempts: Mapping[str, int] | None = None,
    successor: Successor | None = None,
    check_cancel: bool = False,
) -> tuple[NodeEnded, list[tuple[Any, ...]]]:
    """`end_node` and the run-stream append that records it (`append`: see
    `EventStore.one_stream_params`), as one statement on an autocommit connection, so in one transaction
    and one round trip (see ledgerflow.wf_record_node_end). Returns the outcome and the append's rows."""
    params = {**_end_params(claim, retry_in, ready, attempts, successor, check_cancel), **append}
    rows = fetch_all(conn, NodeEndRow, Q["record_node_end"], params)
    return NodeEnded(rows[0].crashes, rows[0].recorded_at), [r.appended for r in rows]


def record_run_end(
    conn: Conn,
    claim: Claim,
    append: Mapping[str, Any],
    next_run: Claimant,
    *,
    read_limit: int,
    retry_in: float | None = None,
    ready: Sequence[NodeSpec] = (),
    attempts: Mapping[str, int] | None = None,
    successor: Successor | None = None,
    check_cancel: bool = False,
) -> RunEnded:
    """`record_node_end` for an end that finishes a run without a key, the claim of a ready node of another
    run for `next_run` (one of its workflows) and the read of that run's snapshot and of at most
    `read_limit` events after it, as one statement on an autocommit connection, so in one transaction and
    one round trip (see ledgerflow.wf_record_run_end)."""
    params = {
        **_end_params(claim, retry_in, ready, attempts, successor, check_cancel),
        **append,
        "claim_worker_name": next_run.worker_name,
        "claim_instance": next_run.instance,
        "claim_worker_id": next_run.worker_id,
        "claim_workflows": TextArray(name for name, _ in next_run.workflows),
        "claim_versions": TextArray(version for _, version in next_run.workflows),
        "claim_ttl": next_run.ttl,
        "read_limit": read_limit,
    }
    rows = fetch_all(conn, RunEndRow, Q["record_run_end"], params)
    ended = [r for r in rows if r.kind == "appended"]
    taken = [r for r in rows if r.kind == "claimed"]
    snapshot = next((r.snapshot for r in rows if r.kind == "snapshot"), None)
    return RunEnded(
        ended[0].outcome,
        [r.appended for r in ended],
        [r.claim for r in taken],
        [r.appended for r in taken],
        [r.event for r in rows if r.kind == "event"],
        snapshot,
    )


def _end_params(
    claim: Claim,
    retry_in: float | None,
    ready: Sequence[NodeSpec],
    attempts: Mapping[str, int] | None,
    successor: Successor | None,
    check_cancel: bool,
) -> dict[str, Any]:
    attempts = attempts or {}
    claimed_first = successor is not None and bool(ready)
    return {
        "run_id": claim.run_id,
        "node": claim.node,
        "token": claim.token,
        "check_cancel": check_cancel,
        "retry_in": retry_in,
        "tenant": claim.tenant,
        "workflow": claim.workflow,
        **node_row_params(ready, names="ready"),
        # A claimed successor's row holds its claim's attempt; a ready one's, the attempts so far.
        "attempts": IntArray(
            attempts.get(s.name, 0) + (1 if claimed_first and i == 0 else 0) for i, s in enumerate(ready)
        ),
        "claim_token": successor.token if claimed_first and successor else None,
        "worker_name": successor.claimant.worker_name if successor else None,
        "instance": successor.claimant.instance if successor else None,
        "ttl": successor.claimant.ttl if successor else None,
    }


def suspend_node(
    conn: Conn, claim: Claim, *, until: datetime | None, now: bool, signal: str | None
) -> Callable[[], datetime]:
    """The node's row is ready again at `until` (None: only when `signal` wakes it), or at once with
    `now`, under the claim's fence. Sent without waiting for its answer (the run-stream append follows it
    in the same round trip); the returned call gives the transaction's timestamp."""
    cursor: psycopg.Cursor[datetime] = sent(
        conn,
        scalar_row,
        Q["suspend_node"],
        {
            "run_id": claim.run_id,
            "node": claim.node,
            "token": claim.token,
            "until": until,
            "now": now,
            "signal": signal,
        },
    )

    def recorded_at() -> datetime:
        at = synced(cursor).fetchone()
        assert at is not None
        return at

    return recorded_at

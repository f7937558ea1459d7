"""Claiming ready nodes and holding them: the claim statement, who claims, the fencing tokens a claim
carries, the heartbeat that renews its lease, and when the next waiting row comes due.

Apart from the statements that end a node or change a run's rows: a claim is the worker's own
request, the one statement that takes rows of many runs at once.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import kwargs_row

from eventstore.spi import TextArray, fetch_value, fetch_values, sent, synced
from workflows.queries import Q
from workflows.run_state import RunState

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Claim:
    run_id: uuid.UUID
    node: str
    tenant: str
    workflow: str
    attempt: int
    token: int
    cancel_requested: bool
    crashes: int
    #: The definition's version the run started with: the node runs with that version only.
    version: str = "1"
    #: The run's state, when the statement that claimed the node also read the run (the end of a run
    #: that claims a node of another run): the worker starts the node without reading the run again.
    loaded: RunState | None = field(default=None, compare=False, repr=False)


#: A workflow's name and one of its versions, as a worker has them (`WorkflowRegistry.definitions`).
WorkflowVersion = tuple[str, str]


def claim(
    conn: Conn,
    *,
    worker_name: str,
    instance: str,
    workflows: Sequence[WorkflowVersion],
    limit: int,
    ttl: float,
    worker_id: str | None = None,
) -> list[Claim]:
    """Claim up to `limit` ready nodes (see `claim_later`); their NodeClaimed events are appended by the
    same statement."""
    claims, _ = claim_later(
        conn,
        worker_name=worker_name,
        instance=instance,
        workflows=workflows,
        limit=limit,
        ttl=ttl,
        worker_id=worker_id,
    )()
    return claims


#: What a claim wrote to the log: (stream id, version, position, transaction id) of each NodeClaimed, the
#: rows `EventStore.appended` takes.
AppendedRows = list[tuple[Any, ...]]


def claim_later(
    conn: Conn,
    *,
    worker_name: str,
    instance: str,
    workflows: Sequence[WorkflowVersion],
    limit: int,
    ttl: float,
    worker_id: str | None = None,
) -> Callable[[], tuple[list[Claim], AppendedRows]]:
    """`claim`, sent without waiting for its answer (in a pipeline); the returned call gives the claims
    and the rows of their NodeClaimed events, which the statement appends to the runs' streams (recorded
    as claimed by `worker_id`, by default `<worker_name>/<instance>`: see ledgerflow.wf_record_claims).
    Only nodes of runs started with one of `workflows`' (name, version) pairs are claimed."""
    cursor = sent(
        conn,
        kwargs_row(_claimed),
        Q["claim"],
        {
            "worker_name": worker_name,
            "instance": instance,
            "worker_id": worker_id or f"{worker_name}/{instance}",
            "workflows": TextArray(name for name, _ in workflows),
            "versions": TextArray(version for _, version in workflows),
            "limit": limit,
            "ttl": ttl,
        },
    )

    def claimed() -> tuple[list[Claim], AppendedRows]:
        rows = synced(cursor).fetchall()
        return [claim for claim, _ in rows], [appended for _, appended in rows]

    return claimed


def _claimed(
    *,
    run_id: uuid.UUID,
    node: str,
    tenant: str,
    workflow: str,
    attempt: int,
    token: int,
    cancel_requested: bool,
    crashes: int,
    version: str,
    stream_id: str,
    stream_version: int,
    position: int,
    transaction_id: int,
) -> tuple[Claim, tuple[Any, ...]]:
    """A row of claim: the claim, and the row of its NodeClaimed event."""
    claim = Claim(run_id, node, tenant, workflow, attempt, token, cancel_requested, crashes, version)
    return claim, (stream_id, stream_version, position, transaction_id)


class FencingTokens:
    """Fencing tokens drawn from the database's sequence a block at a time, so that a worker that hands a
    successor node to itself knows the token before its transaction (the NodeClaimed event carries it) and
    draws it without a round trip of its own. A token only has to differ from every other claim's token
    of the same node; tokens left unused when a process ends are simply never seen."""

    def __init__(self, block: int = 64) -> None:
        self._block = block
        self._tokens: deque[int] = deque()
        self._lock = threading.Lock()

    def take(self, conn: Conn) -> int:
        with self._lock:
            if not self._tokens:
                self._tokens.extend(fetch_values(conn, Q["fencing_tokens"], {"count": self._block}))
            return self._tokens.popleft()


@dataclass(frozen=True)
class Claimant:
    """Who claims: a worker's name and process instance, its id for events, and its lease length."""

    worker_name: str
    instance: str
    worker_id: str
    ttl: float
    tokens: FencingTokens = field(default_factory=FencingTokens, compare=False)
    #: The workflows it runs, (name, version) pairs: when a node's end finishes its run, a ready node of
    #: one of these (of any run) is claimed in the same transaction, so the worker goes on without a
    #: claim of its own.
    workflows: tuple[WorkflowVersion, ...] = ()


def seconds_to_next_due(conn: Conn, workflows: Sequence[str], *, within: float) -> float | None:
    """Seconds until the next of these workflows' waiting rows comes due, if that is within `within`."""
    seconds: float | None = fetch_value(conn, Q["next_due"], {"workflows": list(workflows), "within": within})
    return seconds


def heartbeat(conn: Conn, instance: str, tokens: Sequence[int], ttl: float) -> set[int]:
    return set(fetch_values(conn, Q["heartbeat"], {"instance": instance, "tokens": list(tokens), "ttl": ttl}))

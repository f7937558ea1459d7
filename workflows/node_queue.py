"""The scheduler's queue in SQL: enqueueing, claiming, fencing, heartbeats, reclaiming.

The only module of `workflows` that runs SQL. Every function takes the caller's connection so that a
queue change commits in the same transaction as the run-stream event that causes it.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import kwargs_row, scalar_row

from eventstore.spi import (
    EventRow,
    FloatArray,
    IntArray,
    TextArray,
    fetch_all,
    fetch_one,
    fetch_value,
    fetch_values,
    load_queries,
    pipelined,
    sent,
    synced,
)
from workflows.definition import NodeSpec
from workflows.run_state import RunState

Q = load_queries("workflows")
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


def enqueue(
    conn: Conn,
    run_id: uuid.UUID,
    tenant: str,
    workflow: str,
    version: str,
    specs: Sequence[NodeSpec],
    *,
    attempts: Mapping[str, int] | None = None,
    delay: float = 0.0,
    reset_crashes: bool = False,
    priority: int | None = None,
) -> None:
    """Queue `specs` as ready; `attempts` gives the attempts each node already had in this run, `version`
    the version of the definition the run started with, `priority` the run's (None: the queue reads it
    from the run's RunStarted, migration 0028)."""
    if not specs:
        return
    attempts = attempts or {}
    conn.execute(
        Q["enqueue"],
        {
            "run_id": run_id,
            "tenant": tenant,
            "workflow": workflow,
            "version": version,
            **_node_params(specs),
            "attempts": IntArray(attempts.get(s.name, 0) for s in specs),
            "delays": FloatArray(delay for _ in specs),
            "reset_crashes": reset_crashes,
            "priority": priority,
        },
    )


def _node_params(specs: Sequence[NodeSpec], *, names: str = "nodes") -> dict[str, list[Any]]:
    """The queue row settings of `specs`, as the queue's statements take them (the names under `names`)."""
    return {
        names: TextArray(s.name for s in specs),
        "max_crashes": IntArray(s.max_crashes for s in specs),
        "progress_deadlines": FloatArray(s.progress_deadline for s in specs),
        "on_stuck": TextArray(s.on_stuck for s in specs),
    }


def start_run(
    conn: Conn,
    run_id: uuid.UUID,
    workflow: str,
    version: str,
    specs: Sequence[NodeSpec],
    append: Mapping[str, Any],
    *,
    priority: int = 0,
) -> list[tuple[Any, ...]]:
    """A new run's events (`append`: see `EventStore.one_stream_params`) and `specs` queued as ready, as
    one statement on an autocommit connection (see ledgerflow.wf_start_run); returns the append's rows."""
    return send_start_run(conn, run_id, workflow, version, specs, append, priority=priority).fetchall()


def send_start_run(
    conn: Conn,
    run_id: uuid.UUID,
    workflow: str,
    version: str,
    specs: Sequence[NodeSpec],
    append: Mapping[str, Any],
    *,
    priority: int = 0,
) -> psycopg.Cursor[Any]:
    """`start_run`'s statement, its answer not fetched: in a pipeline, fetched after the COMMIT went out
    with it, a start in a transaction costs one round trip."""
    params = {
        **append,
        "run_id": run_id,
        "workflow": workflow,
        "version": version,
        "priority": priority,
        **_node_params(specs),
    }
    return conn.execute(Q["start_run"], params)


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


@contextmanager
def pipelined_transaction(conn: Conn) -> Iterator[Conn]:
    """A transaction on an autocommit connection whose statements travel together: BEGIN goes with the
    first statements and COMMIT with the final sync, so a transaction that fetches one result midway costs
    two round trips. Whatever goes wrong inside (a driver error, or a check of the caller's that raises
    without the server knowing), nothing of it commits."""
    committed = False
    try:
        with pipelined(conn):
            conn.execute(Q["begin"])
            yield conn
            conn.execute(Q["commit"])
        committed = True
    finally:
        if not committed and not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            # On a broken connection the server rolls back by itself, and the pool discards it.
            with suppress(psycopg.Error):
                conn.execute(Q["rollback"])


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


@dataclass(frozen=True)
class NodeEnded:
    #: Crashes counted so far for the claimed successor (0 for a node queued for the first time).
    successor_crashes: int
    #: The transaction's timestamp: the recorded_at of events appended with the change.
    recorded_at: datetime


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
    rows = fetch_all(conn, _NodeEndRow, Q["record_node_end"], params)
    return NodeEnded(rows[0].crashes, rows[0].recorded_at), [r.appended for r in rows]


@dataclass(frozen=True, slots=True)
class _NodeEndRow:
    """A row of record_node_end: the end's outcome (the same on every row) and one appended event's row."""

    crashes: int
    recorded_at: datetime
    stream_id: str
    stream_version: int
    position: int
    transaction_id: int

    @property
    def appended(self) -> tuple[Any, ...]:
        """In the columns `EventStore.appended` takes."""
        return (self.stream_id, self.stream_version, self.position, self.transaction_id)


@dataclass(frozen=True)
class RunEnded:
    """What `record_run_end` did: the end's outcome and the rows of its appended events, the claim of a
    node of another run (if one was ready) with the row of its NodeClaimed, and that run's snapshot, if it
    has one (its version and JSON: `workflows.snapshots.from_json`), with the events after it as a stream
    read gives them (`EventStore.recorded` turns them into events; signals without their payloads)."""

    outcome: NodeEnded
    appended: list[tuple[Any, ...]]
    claims: list[Claim]
    claims_appended: AppendedRows
    next_run_events: list[EventRow]
    next_run_snapshot: tuple[int, str] | None = None


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
    rows = fetch_all(conn, _RunEndRow, Q["record_run_end"], params)
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


@dataclass(frozen=True, slots=True)
class _RunEndRow:
    """A row of record_run_end (see ledgerflow.wf_record_run_end), one of four kinds (see `kind`)."""

    crashes: int | None
    recorded_at: datetime | None
    stream_id: str | None
    stream_version: int | None
    position: int | None
    transaction_id: int | None
    run_id: uuid.UUID | None
    node: str | None
    tenant: str | None
    workflow: str | None
    attempt: int | None
    token: int | None
    cancel_requested: bool | None
    claim_crashes: int | None
    version: str | None
    event_id: uuid.UUID | None
    event_type: str | None
    data: str | None
    metadata: str | None
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    event_recorded_at: datetime | None

    @property
    def kind(self) -> str:
        """ "appended": an event the end appended (with the end's outcome); "claimed": the claim of a node
        of another run (with its NodeClaimed event's row); "snapshot": that run's snapshot (its version,
        its JSON in `data`); "event": one of that run's events after the snapshot."""
        if self.run_id is None:
            return "appended"
        if self.event_id is not None:
            return "event"
        return "claimed" if self.node is not None else "snapshot"

    @property
    def appended(self) -> tuple[Any, ...]:
        """In the columns `EventStore.appended` takes."""
        return (self.stream_id, self.stream_version, self.position, self.transaction_id)

    @property
    def outcome(self) -> NodeEnded:
        """An "appended" row's outcome of the end, which every such row carries."""
        return NodeEnded(self.crashes, self.recorded_at)  # type: ignore[arg-type]

    @property
    def snapshot(self) -> tuple[int, str]:
        """A "snapshot" row's snapshot: its version and its JSON."""
        return self.stream_version, self.data  # type: ignore[return-value]

    @property
    def claim(self) -> Claim:
        """A "claimed" row's claim: every column of a claim is set on such a row."""
        return Claim(
            self.run_id,  # type: ignore[arg-type]
            self.node,  # type: ignore[arg-type]
            self.tenant,  # type: ignore[arg-type]
            self.workflow,  # type: ignore[arg-type]
            self.attempt,  # type: ignore[arg-type]
            self.token,  # type: ignore[arg-type]
            self.cancel_requested,  # type: ignore[arg-type]
            self.claim_crashes,  # type: ignore[arg-type]
            self.version,  # type: ignore[arg-type]
        )

    @property
    def event(self) -> EventRow:
        """An "event" row's event, as a stream read gives it (`EventStore.recorded` takes it): every column
        of an event is set on such a row."""
        row: Any = self
        return EventRow(
            0,
            row.position,
            row.transaction_id,
            row.tenant,
            row.stream_id,
            row.stream_version,
            row.event_id,
            row.event_type,
            row.data,
            row.metadata,
            row.correlation_id,
            row.causation_id,
            row.event_recorded_at,
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
        **_node_params(ready, names="ready"),
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


def seconds_to_next_due(conn: Conn, workflows: Sequence[str], *, within: float) -> float | None:
    """Seconds until the next of these workflows' waiting rows comes due, if that is within `within`."""
    seconds: float | None = fetch_value(conn, Q["next_due"], {"workflows": list(workflows), "within": within})
    return seconds


def lock_run_nodes(conn: Conn, run_id: uuid.UUID, tenant: str) -> bool:
    """Lock the run's queue rows (see the query); False when it has none: it is not active."""
    cursor = conn.execute(Q["lock_run_nodes"], {"run_id": run_id, "tenant": tenant})
    return bool(synced(cursor).fetchall())


def wake_waiting(conn: Conn, run_id: uuid.UUID, signal: str) -> None:
    """Make the run's nodes waiting for `signal` due now (in a pipeline: nothing is waited for)."""
    conn.execute(Q["wake_waiting"], {"run_id": run_id, "signal": signal})


def release(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    return conn.execute(Q["release"], {"run_id": run_id, "node": node, "token": token}).fetchone() is not None


def hand_back(conn: Conn, run_id: uuid.UUID, node: str, token: int) -> bool:
    """Hand back a node its run's pause interrupted; False if the claim no longer holds it."""
    params = {"run_id": run_id, "node": node, "token": token}
    return conn.execute(Q["hand_back"], params).fetchone() is not None


def heartbeat(conn: Conn, instance: str, tokens: Sequence[int], ttl: float) -> set[int]:
    return set(fetch_values(conn, Q["heartbeat"], {"instance": instance, "tokens": list(tokens), "ttl": ttl}))


def cancel_run(conn: Conn, run_id: uuid.UUID) -> tuple[list[str], list[str]]:
    """Flag the run's claimed nodes and drop its waiting ones; returns (running, dropped) node names."""
    found = fetch_one(conn, _Cancelled, Q["cancel_run"], {"run_id": run_id})
    assert found is not None
    return found.running, found.dropped


def cancel_runs(conn: Conn, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[list[str], list[str]]]:
    """`cancel_run` for many runs in one statement; returns (running, dropped) node names per run."""
    rows = fetch_all(conn, _Cancelled, Q["cancel_runs"], {"run_ids": list(run_ids)})
    return {r.run_id: (r.running, r.dropped) for r in rows if r.run_id is not None}


@dataclass(frozen=True, slots=True)
class _Cancelled:
    """A row of cancel_run, or of cancel_runs (which names the run): the claimed nodes flagged to stop and
    the waiting ones dropped."""

    running: list[str]
    dropped: list[str]
    run_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class _Paused:
    """A row of pause_run: the claimed nodes left running and the ready ones held."""

    running: list[str]
    held: list[str]


def pause_run(conn: Conn, run_id: uuid.UUID, tenant: str, *, interrupt: bool) -> tuple[list[str], list[str]]:
    """Pause the run's queue (after `lock_run_nodes`); returns (running, held) node names."""
    params = {"run_id": run_id, "tenant": tenant, "interrupt": interrupt}
    found = fetch_one(conn, _Paused, Q["pause_run"], params)
    assert found is not None
    return found.running, found.held


def pause_runs(conn: Conn, run_ids: Sequence[uuid.UUID], tenant: str) -> int:
    """`pause_run` (running nodes finish) for many runs of `tenant` in one statement, their rows locked
    first; returns how many ready rows it held."""
    return int(fetch_value(conn, Q["pause_runs"], {"run_ids": list(run_ids), "tenant": tenant}))


def resume_runs(conn: Conn, run_ids: Sequence[uuid.UUID], tenant: str) -> int:
    """`resume_run` for many runs of `tenant` in one statement, their rows locked first; returns how many
    rows are ready again."""
    return int(fetch_value(conn, Q["resume_runs"], {"run_ids": list(run_ids), "tenant": tenant}))


def terminate_run(conn: Conn, run_id: uuid.UUID) -> list[str]:
    """Drop every queue row of the run (after `lock_run_nodes`); returns the nodes dropped."""
    dropped: list[str] = fetch_value(conn, Q["terminate_run"], {"run_id": run_id})
    return dropped


def resume_run(conn: Conn, run_id: uuid.UUID) -> list[str]:
    """Resume the run's queue (after `lock_run_nodes`); returns the nodes ready again."""
    ready: list[str] = fetch_value(conn, Q["resume_run"], {"run_id": run_id})
    return ready


def forget_pause(conn: Conn, run_id: uuid.UUID) -> None:
    """Drop the pause of a run that ended while paused, as it is reopened."""
    conn.execute(Q["forget_pause"], {"run_id": run_id})


@dataclass(frozen=True)
class Recovery:
    id: int
    worker: str
    trigger: str
    started_at: datetime
    duration_ms: float
    found: int
    reclaimed: int
    parked: int
    stuck: int
    failed: int


def recent_recoveries(conn: Conn, limit: int = 20) -> list[Recovery]:
    return fetch_all(conn, Recovery, Q["recent_recoveries"], {"limit": limit})


@dataclass(frozen=True)
class QueueSummary:
    ready: int
    running: int
    orphaned: int
    parked: int


def summary(conn: Conn) -> QueueSummary:
    found = fetch_one(conn, QueueSummary, Q["queue_summary"])
    assert found is not None  # an aggregate answers one row
    return found

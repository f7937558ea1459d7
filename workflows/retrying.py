"""What a retry does to a run, for one run (`Engine.retry`) and for a batch of runs in one transaction
(`retry_batch`, a bulk retry's pages): one decision and one set of events per run, whichever path asks.

A retried run's failed, parked and cancelled nodes (and their descendants that did not succeed) go back to
pending, and the ready ones are queued again, keeping their attempts' history; a run with a key claims its
key again. A batch appends every run's events with one multi-stream append, each run's stream at the
version its state was read at (and each key stream at the version read): a run or key that changed
meanwhile makes the whole append fail (WrongExpectedVersionError), and nothing of the batch is written; its
caller reads the runs again, or takes them one at a time (`Engine.retry` decides afresh for each).

A refresh (`Engine.refresh`) reopens a completed run the same way: `ready_after_reset`, `key_claim` and
`requeue` are the steps both share.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from eventstore import NO_STREAM, EventStore, LedgerflowError, StreamAppend
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_enqueue, queue_run_changes, release_marks
from workflows.definition import Workflow
from workflows.errors import BatchUnfit, RunStateError
from workflows.run_state import RunState
from workflows.scheduler import NodeStatus, retry_from_failed, runnable_nodes
from workflows.workflow_registry import WorkflowRegistry

log = structlog.get_logger(__name__)


def check_retryable(run: RunState) -> None:
    """Raise RunStateError unless `run` is one a retry applies to: failed, cancelled, or with a parked
    node."""
    if run.status not in ("failed", "cancelled") and not any(
        n.status == NodeStatus.PARKED for n in run.nodes.values()
    ):
        raise RunStateError(f"run {run.run_id} is {run.status}; only failed, cancelled or parked runs retry")


@dataclass(frozen=True)
class _Plan:
    run: RunState
    wf: Workflow
    ready: list[str]


def retry_batch(
    store: EventStore,
    registry: WorkflowRegistry,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    *,
    tenant: str,
    actor: str,
) -> dict[uuid.UUID, str | None]:
    """Retry `runs` in the caller's transaction `conn`: their events (and key claims) in one append, then
    their nodes queued again. Returns per run None (retried) or why it was skipped.
    WrongExpectedVersionError: a run or a key changed since it was read; nothing is written. BatchUnfit: a
    run's workflow is not at hand here (the one-run path reports it per run)."""
    outcome: dict[uuid.UUID, str | None] = {}
    candidates: list[RunState] = []
    for run_id, run in runs.items():
        try:
            check_retryable(run)
        except RunStateError as exc:
            outcome[run_id] = str(exc)
            continue
        candidates.append(run)
    # A release lands with an event of the run's stream: the append below, at the version read, fails if
    # one comes after this read.
    marks = release_marks.last_marks(conn, [r.run_id for r in candidates], tenant)
    released = {run_id: mark.released_at for run_id, mark in marks.items() if not mark.restored}
    plans: list[_Plan] = []
    run_appends: list[StreamAppend] = []
    key_appends: list[StreamAppend] = []
    claimed: set[str] = set()
    for run in sorted(candidates, key=lambda r: r.run_id):  # run streams in run order
        if run.run_id in released:
            outcome[run.run_id] = (
                f"run {run.run_id} was released by retention at {released[run.run_id].isoformat()}; "
                f"restore it first (`ledgerflow workflows restore {run.run_id}`), then retry it"
            )
            continue
        try:
            wf = registry.get(run.workflow, run.workflow_version)  # the version it started with
        except LedgerflowError as exc:
            raise BatchUnfit(str(exc)) from exc
        key_append = None
        if run.key is not None and not run.active:
            try:
                key_append = key_claim(store, run, tenant, claimed)
            except RunStateError as exc:
                outcome[run.run_id] = str(exc)
                continue
        reset = retry_from_failed(wf, run.statuses)
        ready = ready_after_reset(wf, run, reset)
        retried = new.run_retried(run_id=run.run_id, nodes=sorted(reset), actor=actor)
        nodes_ready = new.nodes_ready(run_id=run.run_id, nodes=ready)
        run_appends.append(StreamAppend(ev.run_stream(run.run_id), [retried, nodes_ready], run.version))
        if key_append is not None:
            key_appends.append(key_append)
        plans.append(_Plan(run, wf, ready))
        outcome[run.run_id] = None
    if not plans:
        return outcome
    key_appends.sort(key=lambda a: a.stream_id)
    store.append_many(run_appends + key_appends, tenant=tenant, conn=conn)
    # One statement per run (its nodes' queue rows take the run's own settings), sent in a pipeline: the
    # page's round trips are one, not two per run.
    with conn.pipeline():
        for plan in plans:
            requeue(conn, plan.run, plan.wf, plan.ready, tenant)
    log.info("workflow_retry_batch", runs=len(plans), actor=actor)
    return outcome


def ready_after_reset(wf: Workflow, run: RunState, reset: set[str]) -> list[str]:
    """The nodes ready to run once the nodes `reset` of `run` are pending again."""
    statuses = run.statuses
    for name in reset:
        statuses[name] = NodeStatus.PENDING
    return runnable_nodes(wf, statuses)


def requeue(
    conn: psycopg.Connection[Any], run: RunState, wf: Workflow, ready: list[str], tenant: str
) -> None:
    """Queue the `ready` nodes of the reopened `run` again, in the caller's transaction, each keeping its
    attempts' history."""
    if not run.active:
        # A run paused when it ended (its last running nodes ended it) is not paused once reopened.
        queue_run_changes.forget_pause(conn, run.run_id)
    queue_enqueue.enqueue(
        conn,
        run.run_id,
        tenant,
        wf.name,
        run.workflow_version,
        [wf.nodes[n] for n in ready],
        attempts={n: run.node(n).attempt for n in ready},
        reset_crashes=True,
    )


def key_claim(store: EventStore, run: RunState, tenant: str, claimed: set[str]) -> StreamAppend | None:
    """The claim of its key that an ended run reopened makes, at the key stream's version read now; None
    when the run holds it still. RunStateError when another run holds it (or claims it in this batch:
    `claimed`, the key streams claimed so far, which this adds to)."""
    assert run.key is not None
    stream = ev.key_stream(run.workflow, run.key)
    if stream in claimed:
        raise RunStateError(
            f"another run of this batch is retried for key {run.key!r}; retry this one once it has ended"
        )
    last = store.read_stream(stream, tenant=tenant, backward=True, limit=1)
    if last and last[0].type == ev.KEY_CLAIMED and last[0].data["run_id"] != str(run.run_id):
        raise RunStateError(
            f"run {last[0].data['run_id']} is active for key {run.key!r}; cancel it or wait for it first"
        )
    if last and last[0].type == ev.KEY_CLAIMED:
        return None
    claimed.add(stream)
    return StreamAppend(
        stream, [new.key_claimed(run_id=run.run_id)], last[0].stream_version if last else NO_STREAM
    )

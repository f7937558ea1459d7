"""What a cancel does to a run, for one run (`Engine.cancel`) and for a batch of runs in one transaction
(`cancel_batch`, a bulk cancel's): one decision and one set of events, whichever path asks.

A batch appends every run's events with one multi-stream append, each run's stream at the version its
state was read at: a run that changed meanwhile makes the whole append fail (WrongExpectedVersionError),
and nothing of the batch is written; its caller then cancels those runs one at a time, as `Engine.cancel`
decides afresh for each.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import structlog

from eventstore import ANY, EventStore, StreamAppend
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_run_changes
from workflows.errors import RunStateError
from workflows.run_state import RunState

log = structlog.get_logger(__name__)


def cancel_needed(run: RunState) -> bool:
    """Whether a cancel has anything to do to `run`: an ended run raises RunStateError (it is skipped); a
    run being cancelled already needs nothing (False); any other run, running, waiting or paused, is
    cancelled (True)."""
    if not run.active:
        raise RunStateError(f"run {run.run_id} already {run.status}; nothing to cancel")
    return not run.cancel_requested


def cancel_appends(
    run: RunState, running: Sequence[str], dropped: Sequence[str], actor: str
) -> list[StreamAppend]:
    """The appends that cancel `run`, once its queue rows are changed (`queue_run_changes.cancel_run`):
    running nodes stop at their next context call; with none in flight the run is cancelled now, and its
    key freed."""
    run_id = run.run_id
    events = [new.run_cancel_requested(run_id=run_id, actor=actor)]
    events += [new.node_cancelled(run_id=run_id, node=n) for n in dropped]
    ended = not running
    if ended:
        events.append(new.run_cancelled(run_id=run_id))
    appends = [StreamAppend(ev.run_stream(run_id), events, run.version)]
    return appends + (release_key_appends(run) if ended else [])


def cancel_batch(
    store: EventStore,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    *,
    tenant: str,
    actor: str,
) -> dict[uuid.UUID, str | None]:
    """Cancel `runs` in the caller's transaction `conn`: their queue rows in one statement, their events in
    one append. Returns per run None (cancelled, or being cancelled already) or why it was skipped.
    WrongExpectedVersionError: one of the runs changed since it was read; nothing is written."""
    outcome: dict[uuid.UUID, str | None] = {}
    wanted: list[RunState] = []
    for run_id, run in runs.items():
        try:
            if cancel_needed(run):
                wanted.append(run)
            outcome[run_id] = None
        except RunStateError as exc:
            outcome[run_id] = str(exc)
    if not wanted:
        return outcome
    # Run streams in run order, as the queue rows were locked, then the key streams they free.
    wanted.sort(key=lambda r: r.run_id)
    queue = queue_run_changes.cancel_runs(conn, [r.run_id for r in wanted])
    runs_appends: list[StreamAppend] = []
    key_appends: list[StreamAppend] = []
    for run in wanted:
        running, dropped = queue.get(run.run_id, ([], []))
        first, *keys = cancel_appends(run, running, dropped, actor)
        runs_appends.append(first)
        key_appends += keys
    key_appends.sort(key=lambda a: a.stream_id)
    store.append_many(runs_appends + key_appends, tenant=tenant, conn=conn)
    log.info("workflow_cancel_batch", runs=len(wanted), actor=actor)
    return outcome


def release_key_appends(run: RunState) -> list[StreamAppend]:
    """The key stream's release, when a run with a key ends."""
    if run.key is None:
        return []
    return [StreamAppend(ev.key_stream(run.workflow, run.key), [new.key_released(run_id=run.run_id)], ANY)]

"""What a pause or a resume does to a run, for one run (`Engine.pause`, `Engine.resume`) and for a batch of
runs in one transaction (`pause_batch`, `resume_batch`, a bulk action's pages): one decision and one event
per run, whichever path asks.

A batch changes its runs' queue rows in one statement (rows locked in (run, node) order) and appends every
run's event with one multi-stream append, each run's stream at the version its state was read at: a run
that changed meanwhile (a node claimed or ended) makes the whole append fail (WrongExpectedVersionError),
and nothing of the batch is written; its caller reads the runs again, or takes them one at a time.
A batch pause lets running nodes finish, as a bulk pause does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
import structlog

from eventstore import EventStore, NewEvent, StreamAppend
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_run_changes
from workflows.errors import RunStateError
from workflows.run_state import RunState

log = structlog.get_logger(__name__)

#: Per run of a batch: None (acted on, or nothing to do) or why it was skipped.
Outcome = dict[uuid.UUID, str | None]


def pause_needed(run: RunState, *, interrupt: bool = False) -> bool:
    """Whether a pause has anything to do to `run`: an ended run, or one being cancelled, raises
    RunStateError (it is skipped); a paused run needs nothing more unless the pause now interrupts its
    running nodes."""
    if not run.active:
        raise RunStateError(f"run {run.run_id} already {run.status}; nothing to pause")
    if run.cancel_requested:
        raise RunStateError(f"run {run.run_id} is being cancelled; a cancelled run cannot be paused")
    return interrupt or not run.paused


def resume_needed(run: RunState) -> bool:
    """Whether a resume has anything to do to `run`: an ended run raises RunStateError (it is skipped); a
    run that is not paused needs nothing."""
    if not run.active:
        raise RunStateError(f"run {run.run_id} already {run.status}; nothing to resume")
    return run.paused


def pause_batch(
    store: EventStore,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    *,
    tenant: str,
    actor: str,
) -> Outcome:
    """Pause `runs` (running nodes finish) in the caller's transaction `conn`: their queue rows in one
    statement, their RunPaused events in one append. WrongExpectedVersionError: a run changed since it was
    read; nothing is written."""
    outcome, wanted = _decide(runs, pause_needed)
    if wanted:
        held = queue_run_changes.pause_runs(conn, wanted, tenant)
        paused = [new.run_paused(run_id=run_id, actor=actor, interrupt_running=False) for run_id in wanted]
        _append(store, conn, runs, wanted, paused, tenant)
        log.info("workflow_pause_batch", runs=len(wanted), held=held, actor=actor)
    return outcome


def resume_batch(
    store: EventStore,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    *,
    tenant: str,
    actor: str,
) -> Outcome:
    """Resume `runs` in the caller's transaction `conn`, as `pause_batch` pauses them."""
    outcome, wanted = _decide(runs, resume_needed)
    if wanted:
        ready = queue_run_changes.resume_runs(conn, wanted, tenant)
        resumed = [new.run_resumed(run_id=run_id, actor=actor) for run_id in wanted]
        _append(store, conn, runs, wanted, resumed, tenant)
        log.info("workflow_resume_batch", runs=len(wanted), ready=ready, actor=actor)
    return outcome


def _decide(
    runs: Mapping[uuid.UUID, RunState], needed: Callable[[RunState], bool]
) -> tuple[Outcome, list[uuid.UUID]]:
    outcome: Outcome = {}
    wanted: list[uuid.UUID] = []
    for run_id, run in runs.items():
        try:
            if needed(run):
                wanted.append(run_id)
            outcome[run_id] = None
        except RunStateError as exc:
            outcome[run_id] = str(exc)
    # Run streams in run order, as the queue rows are locked.
    return outcome, sorted(wanted)


def _append(
    store: EventStore,
    conn: psycopg.Connection[Any],
    runs: Mapping[uuid.UUID, RunState],
    wanted: list[uuid.UUID],
    events: list[NewEvent],
    tenant: str,
) -> None:
    appends = [
        StreamAppend(ev.run_stream(run_id), [event], runs[run_id].version)
        for run_id, event in zip(wanted, events, strict=True)
    ]
    store.append_many(appends, tenant=tenant, conn=conn)

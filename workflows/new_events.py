"""Typed constructors for every workflow event the engine writes: `new.node_succeeded(run_id=…, …)`.

Each returns the same NewEvent as `event_codec.event(TYPE, run_id, **fields)` with the same fields, so the
stored JSON keeps its shape, and each still checks its fields against the type's model at run time. What
they add is a signature mypy can check at every write: keyword-only, one parameter per payload field.

A parameter without a default is always written, None included. A parameter with a default is one the
payload leaves out when it is unset (the model's default then applies when the event is read): so every
start without a trigger, a parent or tags writes the same payload as before those existed. Run ids of
other runs are taken as UUIDs and written as text, like `run_id`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from eventstore import NewEvent
from workflows import event_codec as codec
from workflows import event_models as em
from workflows import events as ev


def _parent_run(parent_run_id: uuid.UUID | None) -> dict[str, str]:
    """The `parent_run_id` field of a pause or resume, left out unless the parent's caused it."""
    return {} if parent_run_id is None else {"parent_run_id": str(parent_run_id)}


# -- the run --------------------------------------------------------------------------------------


def run_started(
    *,
    run_id: uuid.UUID,
    workflow: str,
    version: str | int,
    key: str | None,
    input: Any,
    input_fingerprint: str,
    nodes: list[str],
    fingerprints: dict[str, str],
    triggered_by: em.TriggeringEvent | None = None,
    priority: int = 0,
    tags: Mapping[str, str] | None = None,
    parent: em.ParentLink | None = None,
    continued_from: uuid.UUID | None = None,
) -> NewEvent:
    optional: dict[str, Any] = {}  # only when set: every other start writes the same payload as before
    if triggered_by is not None:
        optional["triggered_by"] = triggered_by.model_dump()
    if priority:
        optional["priority"] = priority
    if tags:
        optional["tags"] = tags
    if parent is not None:
        optional["parent"] = parent.model_dump()
    if continued_from is not None:
        optional["continued_from"] = str(continued_from)
    return codec.event(
        ev.RUN_STARTED,
        run_id,
        workflow=workflow,
        version=version,
        key=key,
        input=input,
        input_fingerprint=input_fingerprint,
        nodes=nodes,
        fingerprints=fingerprints,
        **optional,
    )


def nodes_ready(*, run_id: uuid.UUID, nodes: list[str]) -> NewEvent:
    return codec.event(ev.NODES_READY, run_id, nodes=nodes)


def run_cancel_requested(*, run_id: uuid.UUID, actor: str | None) -> NewEvent:
    return codec.event(ev.RUN_CANCEL_REQUESTED, run_id, actor=actor)


def run_retried(*, run_id: uuid.UUID, nodes: list[str], actor: str | None) -> NewEvent:
    return codec.event(ev.RUN_RETRIED, run_id, nodes=nodes, actor=actor)


def run_refreshed(
    *,
    run_id: uuid.UUID,
    input: Any,
    input_fingerprint: str,
    fingerprints: dict[str, str],
    nodes: list[str],
    actor: str | None,
) -> NewEvent:
    return codec.event(
        ev.RUN_REFRESHED,
        run_id,
        input=input,
        input_fingerprint=input_fingerprint,
        fingerprints=fingerprints,
        nodes=nodes,
        actor=actor,
    )


def run_completed(*, run_id: uuid.UUID) -> NewEvent:
    return codec.event(ev.RUN_COMPLETED, run_id)


def run_failed(*, run_id: uuid.UUID, node: str | None, error: str | None) -> NewEvent:
    return codec.event(ev.RUN_FAILED, run_id, node=node, error=error)


def run_cancelled(*, run_id: uuid.UUID) -> NewEvent:
    return codec.event(ev.RUN_CANCELLED, run_id)


def run_continued_as_new(*, run_id: uuid.UUID, successor_run_id: uuid.UUID, node: str) -> NewEvent:
    return codec.event(ev.RUN_CONTINUED_AS_NEW, run_id, successor_run_id=str(successor_run_id), node=node)


def run_tagged(
    *, run_id: uuid.UUID, tags: dict[str, str | None], node: str | None, actor: str | None = None
) -> NewEvent:
    return codec.event(
        ev.RUN_TAGGED, run_id, tags=tags, node=node, **({} if actor is None else {"actor": actor})
    )


def run_paused(
    *,
    run_id: uuid.UUID,
    actor: str | None,
    interrupt_running: bool,
    parent_run_id: uuid.UUID | None = None,
) -> NewEvent:
    return codec.event(
        ev.RUN_PAUSED,
        run_id,
        actor=actor,
        interrupt_running=interrupt_running,
        **_parent_run(parent_run_id),
    )


def run_resumed(*, run_id: uuid.UUID, actor: str | None, parent_run_id: uuid.UUID | None = None) -> NewEvent:
    return codec.event(
        ev.RUN_RESUMED,
        run_id,
        actor=actor,
        **_parent_run(parent_run_id),
    )


def run_released(*, run_id: uuid.UUID, retention_seconds: float, actor: str | None) -> NewEvent:
    return codec.event(ev.RUN_RELEASED, run_id, retention_seconds=retention_seconds, actor=actor)


def run_restored(*, run_id: uuid.UUID, actor: str | None) -> NewEvent:
    return codec.event(ev.RUN_RESTORED, run_id, actor=actor)


def key_claimed(*, run_id: uuid.UUID) -> NewEvent:
    return codec.event(ev.KEY_CLAIMED, run_id)


def key_released(*, run_id: uuid.UUID) -> NewEvent:
    return codec.event(ev.KEY_RELEASED, run_id)


# -- a node ---------------------------------------------------------------------------------------


def node_claimed(*, run_id: uuid.UUID, node: str, attempt: int, token: int, worker: str) -> NewEvent:
    return codec.event(ev.NODE_CLAIMED, run_id, node=node, attempt=attempt, token=token, worker=worker)


def node_progress(*, run_id: uuid.UUID, node: str, current: int, total: int | None, message: str) -> NewEvent:
    return codec.event(ev.NODE_PROGRESS, run_id, node=node, current=current, total=total, message=message)


def node_checkpoint(*, run_id: uuid.UUID, node: str, attempt: int | None, item: str, output: Any) -> NewEvent:
    return codec.event(ev.NODE_CHECKPOINT, run_id, node=node, attempt=attempt, item=item, output=output)


def step_recorded(*, run_id: uuid.UUID, node: str, attempt: int | None, key: str, result: Any) -> NewEvent:
    return codec.event(ev.STEP_RECORDED, run_id, node=node, attempt=attempt, key=key, result=result)


def child_started(
    *,
    run_id: uuid.UUID,
    node: str,
    key: str,
    child_run_id: uuid.UUID,
    workflow: str | None,
    parent_close: em.ParentClose | None,
) -> NewEvent:
    return codec.event(
        ev.CHILD_STARTED,
        run_id,
        node=node,
        key=key,
        child_run_id=str(child_run_id),
        workflow=workflow,
        parent_close=parent_close,
    )


def node_succeeded(
    *,
    run_id: uuid.UUID,
    node: str,
    attempt: int | None,
    generation: int,
    output: Any,
    duration_ms: float | None,
) -> NewEvent:
    return codec.event(
        ev.NODE_SUCCEEDED,
        run_id,
        node=node,
        attempt=attempt,
        generation=generation,
        output=output,
        duration_ms=duration_ms,
    )


def node_retry_scheduled(
    *, run_id: uuid.UUID, node: str, attempt: int | None, error: str, retry_in: float | None
) -> NewEvent:
    return codec.event(
        ev.NODE_RETRY_SCHEDULED, run_id, node=node, attempt=attempt, error=error, retry_in=retry_in
    )


def node_failed(
    *, run_id: uuid.UUID, node: str, attempt: int | None, error: str, error_class: str | None
) -> NewEvent:
    return codec.event(
        ev.NODE_FAILED, run_id, node=node, attempt=attempt, error=error, error_class=error_class
    )


def node_reclaimed(
    *,
    run_id: uuid.UUID,
    node: str,
    attempt: int | None,
    previous_worker: str | None,
    reason: str | None,
) -> NewEvent:
    return codec.event(
        ev.NODE_RECLAIMED,
        run_id,
        node=node,
        attempt=attempt,
        previous_worker=previous_worker,
        reason=reason,
    )


def node_released(*, run_id: uuid.UUID, node: str, worker: str | None, reason: str | None = None) -> NewEvent:
    return codec.event(
        ev.NODE_RELEASED, run_id, node=node, worker=worker, **({} if reason is None else {"reason": reason})
    )


def node_stuck(*, run_id: uuid.UUID, node: str, seconds: float | None, action: str | None) -> NewEvent:
    return codec.event(ev.NODE_STUCK, run_id, node=node, seconds=seconds, action=action)


def node_parked(*, run_id: uuid.UUID, node: str, crashes: int | None, error: str | None) -> NewEvent:
    return codec.event(ev.NODE_PARKED, run_id, node=node, crashes=crashes, error=error)


def node_cancelled(*, run_id: uuid.UUID, node: str) -> NewEvent:
    return codec.event(ev.NODE_CANCELLED, run_id, node=node)


# -- waiting --------------------------------------------------------------------------------------


def node_waiting(
    *,
    run_id: uuid.UUID,
    node: str,
    attempt: int,
    key: str,
    until: str | None,
    signal: str | None,
) -> NewEvent:
    return codec.event(
        ev.NODE_WAITING, run_id, node=node, attempt=attempt, key=key, until=until, signal=signal
    )


def signal_received(*, run_id: uuid.UUID, name: str, payload: Any, actor: str | None) -> NewEvent:
    return codec.event(ev.SIGNAL_RECEIVED, run_id, name=name, payload=payload, actor=actor)


def signal_taken(
    *, run_id: uuid.UUID, node: str, attempt: int | None, key: str, name: str, index: int | None
) -> NewEvent:
    return codec.event(ev.SIGNAL_TAKEN, run_id, node=node, attempt=attempt, key=key, name=name, index=index)

"""Children follow their parent: when a run is cancelled, fails or is paused, so are the runs its nodes
started (`NodeContext.start_workflow`), by their parent-close policy, recursively; a resumed run resumes
its paused children.

- `cancel` (the default): the child is cancelled as an operator would cancel it (its running nodes stop at
  their next context call), or paused as its parent was;
- `terminate`: the child ends at once (`Engine.terminate`: its running nodes do not finish), or is paused
  with its running nodes interrupted;
- `abandon`: the child is left alone.

A run's completion leaves its children alone, whatever their policy: a parent may start children and
finish before they do. Children started before there were policies (no `parent` in their RunStarted) are
left alone too.

The projection `workflow_children` drives it, a durable consumer of the log like the trigger
projections (run by every workflow worker beside them, one applier at a time): it keeps each child's link
to its parent (from the child's RunStarted) and, for each cancellation, failure, pause or resume of a run,
acts on that run's linked children through the engine, so each child's stream gets its own RunCancelled,
RunPaused or RunResumed, and its own children follow in turn. The actions are idempotent and decided from
the parent's current state, not from the event alone: an event applied again (after a crash between an
action and the cursor's commit, in a replay, in a rebuild) repeats nothing and never re-pauses a child
whose parent has since been resumed. A child started after its parent was cancelled or paused (a node
that started it before its next context call saw the cancellation) is caught up with its parent when its
own RunStarted is applied.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
import structlog
from psycopg.rows import dict_row

from eventstore import NotFoundError, RecordedEvent
from eventstore.spi import is_unavailable, load_queries
from projector import ApplyContext, Projection, Table
from workflows import event_codec as codec
from workflows import event_models as em
from workflows import events as ev
from workflows.engine import Engine
from workflows.errors import RunStateError
from workflows.run_state import RunState

log = structlog.get_logger(__name__)
Q = load_queries("workflows", "children.sql")
NAME = "workflow_children"

#: The events a child may have to follow: its own start (its link) and its parent's changes.
EVENT_TYPES = (
    ev.RUN_STARTED,
    ev.RUN_CANCEL_REQUESTED,
    ev.RUN_CANCELLED,
    ev.RUN_FAILED,
    ev.RUN_PAUSED,
    ev.RUN_RESUMED,
    # Retention: a released run's links go; a restored run's come back from its stream.
    ev.RUN_RELEASED,
    ev.RUN_RESTORED,
)


def children_projection(engine: Engine) -> Projection:
    projection = Projection(
        name=NAME,
        version=1,
        tables=[Table(NAME, Q["create_children"])],
        event_types=list(EVENT_TYPES),
        per_tenant=True,  # a child runs in its parent's tenant: the link and the actions stay in it
        replay_in_place=True,  # links are upserted; actions are idempotent and follow the current state
        failure_policy="park",  # a parent whose children cannot be reached waits for an operator alone
    )

    @projection.on_batch
    def follow(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
        for e in events:
            if not codec.is_workflow_event(e):
                continue
            try:
                _apply(engine, ctx, e)
            except Exception as exc:
                if is_unavailable(exc):
                    # An outage is waited out by the runner, not recorded as this event's failure.
                    raise psycopg.OperationalError(str(exc)) from exc
                raise

    return projection


def _apply(engine: Engine, ctx: ApplyContext, e: RecordedEvent) -> None:
    event = codec.parse(e)
    if isinstance(event, em.RunReleased):
        ctx.execute(Q["unlink"], (e.tenant, event.run_id, event.run_id))
        return
    if isinstance(event, em.RunRestored):
        _relink(ctx, e.tenant, event.run_id)
        return
    if isinstance(event, em.RunStarted):
        if event.parent is None:
            return
        parent_id = uuid.UUID(event.parent.run_id)
        ctx.execute(Q["link"], (e.tenant, parent_id, event.run_id, event.parent.parent_close))
        parent = _load(engine, parent_id, e.tenant)
        if parent is not None:
            follow_parent(engine, parent, event.run_id, event.parent.parent_close)
        return
    with ctx.conn.cursor(row_factory=dict_row) as cur:
        children = cur.execute(ctx.sql(Q["children_of"]), (e.tenant, event.run_id)).fetchall()
    if not children:
        return
    parent = _load(engine, event.run_id, e.tenant)
    if parent is None:
        return
    for child in children:
        follow_parent(engine, parent, child["child_run_id"], child["parent_close"])


def _relink(ctx: ApplyContext, tenant: str, run_id: uuid.UUID) -> None:
    params = {"tenant": tenant, "run_id": str(run_id), "stream": ev.run_stream(run_id)}
    links = ctx.conn.execute(Q["links_of_restored"], params).fetchall()
    for parent_id, child_id, policy in links:
        if policy in em.PARENT_CLOSE_POLICIES:
            ctx.execute(Q["link"], (tenant, parent_id, child_id, policy))


def _load(engine: Engine, run_id: uuid.UUID, tenant: str) -> RunState | None:
    try:
        return engine.load(run_id, tenant=tenant)
    except NotFoundError:
        return None


def follow_parent(engine: Engine, parent: RunState, child_id: uuid.UUID, policy: str) -> str | None:
    """Bring one child in line with its parent's current state, by its policy; returns what was done
    ("cancel", "terminate", "pause", "resume") or None. Idempotent: a child already there is left as it is."""
    if policy == "abandon":
        return None
    child = _load(engine, child_id, parent.tenant)
    if child is None or not child.active:
        return None
    actor = f"parent:{parent.run_id}"
    action: str | None = None
    try:
        if parent.status in ("cancelled", "failed") or parent.cancel_requested:
            if policy == "terminate":
                engine.terminate(child_id, tenant=parent.tenant, actor=actor)
                action = "terminate"
            elif not child.cancel_requested:
                engine.cancel(child_id, tenant=parent.tenant, actor=actor)
                action = "cancel"
        elif parent.paused:
            interrupt = policy == "terminate"
            if not child.paused and not child.cancel_requested:
                engine.pause(
                    child_id,
                    interrupt_running=interrupt,
                    tenant=parent.tenant,
                    actor=actor,
                    parent_run_id=parent.run_id,
                )
                action = "pause"
        elif parent.active and child.paused:
            engine.resume(child_id, tenant=parent.tenant, actor=actor, parent_run_id=parent.run_id)
            action = "resume"
    except RunStateError:
        return None  # the child ended meanwhile: nothing to follow
    if action is not None:
        log.info(
            "workflow_child_followed_parent",
            parent_run_id=str(parent.run_id),
            child_run_id=str(child_id),
            action=action,
            policy=policy,
        )
    return action

"""Workflow runs: list, detail, cancel, retry, refresh, signals (`/api/v1/runs`).

The detail is folded from the run's own events, so it is exact (the list and the history are in
`ops.api.run_search`). Runs of other tenants are not found.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from eventstore import IDEMPOTENCY_KEY_PATTERN, NotFoundError
from ops.api.deps import Operator, Reader, ServicesDep
from ops.api.errors import CONFLICT, NOT_FOUND
from ops.api.events import _ExactJsonRoute as ExactJsonRoute
from ops.auth import Principal
from ops.services import Services
from workflows import NodeState, RunState, release_of, restore_run

router = APIRouter(tags=["runs"])

RunStatus = Literal["running", "paused", "succeeded", "failed", "cancelled", "continued"]


class ProgressOut(BaseModel):
    current: int
    total: int | None
    message: str


class NodeOut(BaseModel):
    name: str
    status: str
    attempt: int
    progress: ProgressOut | None
    error: str | None
    generation: int | None
    checkpoints: int = Field(description="Items checkpointed by the current attempt's work so far.")
    steps: int = Field(description="Memoized steps recorded.")
    crashes: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    depends_on: list[str]
    waiting_for: str | None = Field(
        description="While the node waits (status `waiting`): the signal it waits for; null for a timer."
    )
    wake_at: datetime | None = Field(
        description="While the node waits: when it wakes at the latest (a timer's due time, or a signal "
        "wait's timeout); null for a signal wait without a timeout."
    )


class EdgeOut(BaseModel):
    source: str = Field(description="The dependency.")
    target: str = Field(description="The node that waits for it.")


class TriggeredByOut(BaseModel):
    event_id: str
    stream_id: str
    type: str
    transaction_id: int
    position: int


class ReleasedOut(BaseModel):
    at: datetime = Field(description="When retention released the run from the run tables.")
    actor: str | None = Field(description="Who released it (a retention pass: `bulk:<action id>`).")


class ParentOut(BaseModel):
    run_id: uuid.UUID = Field(description="The parent run.")
    node: str = Field(description="The parent's node that started this run.")
    parent_close: str = Field(description="What this run does when its parent is cancelled, fails or pauses.")


class RunDetailOut(BaseModel):
    run_id: uuid.UUID
    workflow: str
    key: str | None
    parent: ParentOut | None = Field(
        default=None, description="The run whose node started this one (a child run); null otherwise."
    )
    continued_from: uuid.UUID | None = Field(
        default=None, description="The run this one continues (`ctx.continue_as_new`); null otherwise."
    )
    continued_as: uuid.UUID | None = Field(
        default=None, description="The run this one continued as (status `continued`); null otherwise."
    )
    triggered_by: TriggeredByOut | None = Field(
        default=None,
        description="The log event whose arrival started the run (a trigger) and its cursor; null otherwise.",
    )
    status: str
    cancel_requested: bool
    error: str | None
    input: Any
    version: int = Field(description="The run stream's version: changes with every event of the run.")
    workflow_version: str = Field(
        description="The version of the workflow's definition the run started with: only a worker that "
        "has this version goes on with it."
    )
    priority: int = Field(
        default=0, description="The run's priority: higher is claimed first among its tenant's ready nodes."
    )
    started_at: datetime | None
    finished_at: datetime | None
    definition_known: bool = Field(description="Whether this server has the workflow's definition (edges).")
    nodes: list[NodeOut] = Field(description="In topological order when the definition is known.")
    edges: list[EdgeOut]
    may_operate: bool = Field(
        description="Whether the token that asked may signal, cancel, retry and refresh runs (scope "
        "`operate`): the console offers those levers only then."
    )
    released: ReleasedOut | None = Field(
        default=None,
        description="Set when retention released the run: it is not listed, and `POST .../restore` brings "
        "it back (null otherwise).",
    )


class NodeDetailOut(NodeOut):
    run_id: uuid.UUID
    output: Any = Field(
        description="What the node returned (its latest success); null until it succeeds, and after a "
        "refresh or retry re-opens it."
    )


class RefreshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Any = Field(default=None, description="The new input: any JSON value (absent: null).")


class RefreshOut(BaseModel):
    run_id: uuid.UUID
    rerun: list[str] = Field(description="The nodes that run again; empty when nothing changed.")


def _node_fields(n: NodeState, depends_on: list[str]) -> dict[str, Any]:
    progress = None
    if n.progress is not None:
        progress = ProgressOut(current=n.progress[0], total=n.progress[1], message=n.progress[2])
    return dict(
        name=n.name,
        status=str(n.status),
        attempt=n.attempt,
        progress=progress,
        error=n.error,
        generation=n.generation,
        checkpoints=len(n.checkpoints),
        steps=len(n.steps),
        crashes=n.crashes,
        worker=n.worker,
        started_at=n.started_at,
        finished_at=n.finished_at,
        depends_on=depends_on,
        waiting_for=n.waiting_for,
        wake_at=n.wake_at,
    )


def _node_out(n: NodeState, depends_on: list[str]) -> NodeOut:
    return NodeOut(**_node_fields(n, depends_on))


def _definition_edges(run: RunState, services: Services) -> dict[str, list[str]] | None:
    """Each node's dependencies from the workflow's definition; None when this server lacks it."""
    if run.workflow_version not in services.registry.versions(run.workflow):
        return None
    wf = services.registry.get(run.workflow, run.workflow_version)
    return {name: list(spec.depends_on) for name, spec in wf.nodes.items()}


def run_detail(run: RunState, services: Services, principal: Principal) -> RunDetailOut:
    """The run with every node, in DAG order, and the DAG's edges when the definition is known, as
    `principal` sees it."""
    edges = _definition_edges(run, services)
    known = edges is not None
    deps = edges or {}
    order = list(run.nodes)
    if known:
        wf = services.registry.get(run.workflow, run.workflow_version)
        order = [n for n in wf.topological_order() if n in run.nodes]
        order += [n for n in run.nodes if n not in order]  # nodes since removed from the definition
    return RunDetailOut(
        run_id=run.run_id,
        workflow=run.workflow,
        key=run.key,
        parent=ParentOut(**run.parent.model_dump()) if run.parent is not None else None,
        continued_from=uuid.UUID(run.continued_from) if run.continued_from is not None else None,
        continued_as=uuid.UUID(run.continued_as) if run.continued_as is not None else None,
        triggered_by=TriggeredByOut(**run.triggered_by.model_dump())
        if run.triggered_by is not None
        else None,
        status=run.status,
        cancel_requested=run.cancel_requested,
        error=run.error,
        input=run.input,
        version=run.version,
        workflow_version=run.workflow_version,
        priority=run.priority,
        started_at=run.started_at,
        finished_at=run.finished_at,
        definition_known=known,
        nodes=[_node_out(run.nodes[n], deps.get(n, [])) for n in order],
        edges=[EdgeOut(source=d, target=n) for n in order for d in deps.get(n, [])],
        may_operate=principal.allows("operate"),
        released=_released(run, services),
    )


def _released(run: RunState, services: Services) -> ReleasedOut | None:
    found = release_of(services.store, run.run_id, tenant=run.tenant)
    return ReleasedOut(at=found.released_at, actor=found.actor) if found is not None else None


@router.get("/runs/{run_id}", response_model=RunDetailOut, responses=NOT_FOUND)
def get_run(run_id: uuid.UUID, principal: Reader, services: ServicesDep) -> RunDetailOut:
    """One run, exact: folded from its events, with every node and the DAG's edges."""
    return run_detail(services.engine.load(run_id, tenant=principal.tenant), services, principal)


@router.get("/runs/{run_id}/nodes/{node}", response_model=NodeDetailOut, responses=NOT_FOUND)
def get_node(
    run_id: uuid.UUID, node: Annotated[str, Path(max_length=200)], principal: Reader, services: ServicesDep
) -> NodeDetailOut:
    """One node of a run with its output (exact: folded from the run's events). The run detail leaves
    outputs out, since it is polled while the run is active and outputs may be large."""
    run = services.engine.load(run_id, tenant=principal.tenant)
    if node not in run.nodes:
        raise NotFoundError(f"run {run_id} has no node {node!r}; its nodes: {', '.join(run.nodes)}")
    deps = _definition_edges(run, services) or {}
    state = run.nodes[node]
    return NodeDetailOut(run_id=run_id, output=state.output, **_node_fields(state, deps.get(node, [])))


@router.post("/runs/{run_id}/cancel", response_model=RunDetailOut, responses={**NOT_FOUND, **CONFLICT})
def cancel_run(run_id: uuid.UUID, principal: Operator, services: ServicesDep) -> RunDetailOut:
    """Cancel: waiting nodes never start; a running node stops at its next call to its context."""
    run = services.engine.cancel(run_id, tenant=principal.tenant, actor=f"api:{principal.token_id}")
    return run_detail(run, services, principal)


class PauseRequest(BaseModel):
    interrupt_running: bool = Field(
        default=False,
        description="Stop the running nodes at their next call to their context and hand them back, to go "
        "on from their checkpoints once resumed (default: they finish).",
    )


@router.post("/runs/{run_id}/pause", response_model=RunDetailOut, responses={**NOT_FOUND, **CONFLICT})
def pause_run(
    run_id: uuid.UUID, principal: Operator, services: ServicesDep, body: PauseRequest | None = None
) -> RunDetailOut:
    """Pause: the run starts no new node until resumed; its running nodes finish (or, with
    `interrupt_running`, stop and go back). Pausing a paused run changes nothing; an ended run: 409."""
    run = services.engine.pause(
        run_id,
        interrupt_running=body.interrupt_running if body is not None else False,
        tenant=principal.tenant,
        actor=f"api:{principal.token_id}",
    )
    return run_detail(run, services, principal)


@router.post("/runs/{run_id}/resume", response_model=RunDetailOut, responses={**NOT_FOUND, **CONFLICT})
def resume_run(run_id: uuid.UUID, principal: Operator, services: ServicesDep) -> RunDetailOut:
    """Resume a paused run where it was; completed nodes and memoized steps are not run again. Resuming a
    run that is not paused changes nothing; an ended run: 409."""
    run = services.engine.resume(run_id, tenant=principal.tenant, actor=f"api:{principal.token_id}")
    return run_detail(run, services, principal)


@router.post("/runs/{run_id}/restore", response_model=RunDetailOut, responses={**NOT_FOUND, **CONFLICT})
def restore(run_id: uuid.UUID, principal: Operator, services: ServicesDep) -> RunDetailOut:
    """Bring a run that retention released back into the run tables (once the projector has applied it),
    for inspection: equal to what it was. A run not released: 409."""
    restore_run(services.engine, run_id, tenant=principal.tenant, actor=f"api:{principal.token_id}")
    return run_detail(services.engine.load(run_id, tenant=principal.tenant), services, principal)


@router.post("/runs/{run_id}/retry", response_model=RunDetailOut, responses={**NOT_FOUND, **CONFLICT})
def retry_run(run_id: uuid.UUID, principal: Operator, services: ServicesDep) -> RunDetailOut:
    """Run a failed, cancelled or parked run again from its failed nodes; completed work is kept."""
    run = services.engine.retry(run_id, tenant=principal.tenant, actor=f"api:{principal.token_id}")
    return run_detail(run, services, principal)


@router.post("/runs/{run_id}/refresh", response_model=RefreshOut, responses={**NOT_FOUND, **CONFLICT})
def refresh_run(
    run_id: uuid.UUID, principal: Operator, services: ServicesDep, body: RefreshRequest | None = None
) -> RefreshOut:
    """Re-run a completed run with new input: only the nodes whose input or code changed, and below."""
    rerun = services.engine.refresh(
        run_id,
        input=body.input if body is not None else None,
        tenant=principal.tenant,
        actor=f"api:{principal.token_id}",
    )
    return RefreshOut(run_id=run_id, rerun=sorted(rerun))


class SignalSentOut(BaseModel):
    run_id: uuid.UUID
    name: str
    position: int = Field(description="The log position of the signal (of the first send, for a repeat).")
    duplicate: bool = Field(
        description="True when the Idempotency-Key matched an earlier send: its answer, nothing recorded."
    )


def send_signal(
    run_id: uuid.UUID,
    name: Annotated[
        str,
        Path(
            max_length=100,
            description="The signal's name (letters, digits and `_.:-`), as the node waits for it "
            "(`ctx.wait_for_signal(name)`).",
        ),
    ],
    principal: Operator,
    services: ServicesDep,
    response: Response,
    payload: Annotated[Any, Body(description="The signal's payload: any JSON value (no body: null).")] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            pattern=IDEMPOTENCY_KEY_PATTERN.pattern,
            description="A repeat returns the first send's answer (`duplicate`) and records nothing; "
            "another payload under the same key conflicts.",
        ),
    ] = None,
) -> SignalSentOut:
    """Send signal `name` to a run: the node waiting for it (`ctx.wait_for_signal`) wakes with the body
    as its payload; a signal sent before any node waits is kept for the first that does. A run that has
    ended is a 409 (no node would ever take the signal)."""
    sent = services.engine.signal(
        run_id,
        name,
        payload,
        idempotency_key=idempotency_key,
        tenant=principal.tenant,
        actor=f"api:{principal.token_id}",
    )
    if sent.duplicate:
        response.status_code = 200
    return SignalSentOut(run_id=sent.run_id, name=sent.name, position=sent.position, duplicate=sent.duplicate)


# The payload is written to the log: its numbers keep their exact value, as an append's do.
router.add_api_route(
    "/runs/{run_id}/signals/{name}",
    send_signal,
    methods=["POST"],
    status_code=201,
    response_model=SignalSentOut,
    responses={200: {"model": SignalSentOut, "description": "A repeat."}, **NOT_FOUND, **CONFLICT},
    route_class_override=ExactJsonRoute,
)

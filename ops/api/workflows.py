"""Workflow definitions and starting runs: `/api/v1/workflows`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from eventstore import IDEMPOTENCY_KEY_PATTERN
from ops.api.deps import Reader, ServicesDep, Starter
from ops.api.errors import CONFLICT, NOT_FOUND, QUOTA
from workflows import MAX_DEBOUNCE_WINDOW as MAX_WINDOW
from workflows import PRIORITY_MAX, PRIORITY_MIN, Debounce, NodeSpec, Workflow

router = APIRouter(tags=["workflows"])


class NodeDefinitionOut(BaseModel):
    name: str
    depends_on: list[str]
    max_attempts: int
    timeout: float | None
    progress_deadline: float | None
    code_version: str


class WorkflowOut(BaseModel):
    name: str
    version: str = Field(description="The newest registered version: new runs start with it.")
    versions: list[str] = Field(
        description="Every version this server has, oldest first: runs go on with the one they started with."
    )
    nodes: list[NodeDefinitionOut] = Field(
        description="In topological order: every node after its dependencies."
    )
    roots: list[str]


class WorkflowList(BaseModel):
    workflows: list[WorkflowOut]


def node_definition(spec: NodeSpec) -> NodeDefinitionOut:
    return NodeDefinitionOut(
        name=spec.name,
        depends_on=list(spec.depends_on),
        max_attempts=spec.retry.max_attempts,
        timeout=spec.timeout,
        progress_deadline=spec.progress_deadline,
        code_version=spec.code_version,
    )


def workflow_out(wf: Workflow, versions: list[str] | None = None) -> WorkflowOut:
    return WorkflowOut(
        name=wf.name,
        version=wf.version,
        versions=versions if versions is not None else [wf.version],
        nodes=[node_definition(wf.nodes[n]) for n in wf.topological_order()],
        roots=wf.roots(),
    )


@router.get("/workflows", response_model=WorkflowList)
def list_workflows(principal: Reader, services: ServicesDep) -> WorkflowList:
    """The workflows this server knows, each with its DAG."""
    registry = services.registry
    return WorkflowList(
        workflows=[workflow_out(registry.get(name), registry.versions(name)) for name in registry.names()]
    )


class DebounceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200, description="Starts with this key make one burst.")
    window: float = Field(
        gt=0, le=MAX_WINDOW, description="The run starts this many seconds after the burst's last start."
    )
    max_wait: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WINDOW,
        description="...or this many seconds after its first start, whichever comes first.",
    )


class StartRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Any = Field(default=None, description="The run's input: any JSON value.")
    key: str | None = Field(
        default=None, min_length=1, max_length=200, description="At most one active run per key."
    )
    priority: StrictInt | None = Field(
        default=None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="Higher is claimed first among the tenant's ready nodes; default: the workflow's.",
    )
    tags: dict[str, str] | None = Field(
        default=None,
        description="Key/value strings to find the run by (`GET /api/v1/runs?tag=KEY=VALUE`); bounded by "
        "LEDGERFLOW_MAX_TAGS_PER_RUN, _TAG_KEY_CHARS and _TAG_VALUE_CHARS (422 beyond, nothing written).",
    )
    debounce: DebounceIn | None = Field(
        default=None,
        description="One run per burst of starts with this key, with the latest start's input, once the "
        "burst pauses for `window` seconds (not with `key` or an Idempotency-Key). The answer names the "
        "run to come; it exists from `debounced_until` on (a worker starts it within a second).",
    )


class StartedOut(BaseModel):
    run_id: uuid.UUID
    created: bool = Field(
        description="False when an existing run was returned (same key or Idempotency-Key)."
    )
    cursor: str = Field(
        description="A log cursor at or beyond the run's start: pass it as `min_cursor` to GET /api/v1/runs "
        "to read the run list with this run in it."
    )
    debounced_until: datetime | None = Field(
        default=None,
        description="Only for a debounced start: when the burst's run starts at the earliest, as of this "
        "start.",
    )


@router.post(
    "/workflows/{workflow}/runs",
    status_code=201,
    response_model=StartedOut,
    response_model_exclude_none=True,  # `debounced_until` only for a debounced start
    responses={
        200: {"model": StartedOut, "description": "An existing run was returned."},
        **NOT_FOUND,
        **CONFLICT,
        **QUOTA,
    },
)
def start_run(
    workflow: Annotated[str, Path(max_length=63)],
    body: StartRunRequest,
    principal: Starter,
    services: ServicesDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            pattern=IDEMPOTENCY_KEY_PATTERN.pattern,
            description="A repeat returns the first run; other input under the same key conflicts.",
        ),
    ] = None,
) -> StartedOut:
    """Start a run of `workflow` for the token's tenant."""
    debounce = None
    if body.debounce is not None:
        debounce = Debounce(body.debounce.key, body.debounce.window, body.debounce.max_wait)
    started = services.engine.start(
        workflow,
        input=body.input,
        key=body.key,
        idempotency_key=idempotency_key,
        tenant=principal.tenant,
        priority=body.priority,
        debounce=debounce,
        tags=body.tags,
    )
    if not started.created:
        response.status_code = 200
    # An existing run's start is older than anything committed before now.
    cursor = started.cursor or services.store.committed_so_far()
    return StartedOut(
        run_id=started.run_id,
        created=started.created,
        cursor=str(cursor),
        debounced_until=started.debounced_until,
    )

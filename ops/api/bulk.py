"""Bulk operator actions on runs: `POST /api/v1/runs/bulk/{kind}` (cancel, retry, pause, resume: the
kinds of `workflows.BULK_KINDS`) over every run of the tenant a filter keeps, and
`GET /api/v1/runs/bulk/{id}`.

A request with `dry_run` only counts the runs. Otherwise the action is recorded at once and answered with
202 and its record; it is worked in the background (the tenant's job lane, see ops.api.jobs), and its
progress read with the GET. The job waits out an outage of the database and resumes the action where it
stopped (ops.api.bulk_resume.bulk_job). More matching runs than `LEDGERFLOW_BULK_MAX_RUNS` is a 422 that
records nothing. Actions of other tenants are not found.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from ops.api.bulk_resume import bulk_job
from ops.api.deps import JobsDep, Operator, Reader, ServicesDep
from ops.api.errors import NOT_FOUND
from ops.api.run_search import RunStatus
from workflows import (
    BULK_KINDS,
    BulkAction,
    RunFilter,
    bulk_action,
    create_bulk_action,
    plan_bulk,
    tag_filter,
)

router = APIRouter(tags=["runs"])

_MAX_REPEATS = 16
Kind = Annotated[str, Path(max_length=40, description=f"One of: {', '.join(sorted(BULK_KINDS))}.")]


class BulkRequest(BaseModel):
    """The filter (the fields of `GET /api/v1/runs`), and whether only to count."""

    model_config = ConfigDict(extra="forbid")

    status: list[RunStatus] = Field(default_factory=list, max_length=_MAX_REPEATS)
    workflow: str | None = Field(default=None, max_length=63)
    version: str | None = Field(default=None, max_length=63)
    tag: list[str] = Field(default_factory=list, max_length=_MAX_REPEATS, description="`KEY=VALUE` each.")
    started_after: datetime | None = None
    started_before: datetime | None = None
    ended_after: datetime | None = None
    ended_before: datetime | None = None
    parent: uuid.UUID | None = None
    triggered_by: str | None = Field(default=None, max_length=100)
    dry_run: bool = Field(default=False, description="Only count the runs the action would touch.")

    def run_filter(self) -> RunFilter:
        return RunFilter(
            workflow=self.workflow,
            version=self.version,
            statuses=tuple(self.status),
            tags=tag_filter(self.tag),
            started_after=self.started_after,
            started_before=self.started_before,
            ended_after=self.ended_after,
            ended_before=self.ended_before,
            parent=self.parent,
            triggered_by=self.triggered_by,
        )


class BulkActionOut(BaseModel):
    id: uuid.UUID | None = Field(description="The action's id (null for a dry run).")
    kind: str
    dry_run: bool
    state: str = Field(description="running, completed or failed; `dry_run` for a dry run.")
    matched: int = Field(description="The runs the filter kept when the action was recorded.")
    limit: int = Field(description="The most runs one action takes (LEDGERFLOW_BULK_MAX_RUNS).")
    over_limit: bool = False
    actor: str | None = None
    filter: dict[str, Any] | None = None
    done: int = 0
    failed: int = 0
    skipped: int = 0
    last_run_id: uuid.UUID | None = Field(default=None, description="The last run processed.")
    last_error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    ended_at: datetime | None = None


@router.post("/runs/bulk/{kind}", status_code=202, response_model=BulkActionOut, responses=NOT_FOUND)
def start_bulk_action(
    kind: Kind, body: BulkRequest, principal: Operator, services: ServicesDep, jobs: JobsDep
) -> BulkActionOut:
    """Act on every run of the tenant the filter keeps (or, with `dry_run`, count them). The answer
    comes at once; follow the action with `GET /api/v1/runs/bulk/{id}`."""
    wanted, limit = body.run_filter(), services.settings.bulk_max_runs
    store = services.store
    if body.dry_run:
        plan = plan_bulk(store, kind=kind, tenant=principal.tenant, filter=wanted, limit=limit)
        return BulkActionOut(
            id=None,
            kind=kind,
            dry_run=True,
            state="dry_run",
            matched=plan.matched,
            limit=limit,
            over_limit=plan.over_limit,
        )
    with jobs.reserve(principal.tenant) as place:
        action = create_bulk_action(
            store,
            kind=kind,
            tenant=principal.tenant,
            filter=wanted,
            actor=f"api:{principal.token_id}",
            limit=limit,
        )
        place.submit(
            f"bulk_{kind}",
            bulk_job(services.engine, jobs, action.id, principal.tenant),
            bulk_id=str(action.id),
        )
    return _out(action)


@router.get("/runs/bulk/{action_id}", response_model=BulkActionOut, responses=NOT_FOUND)
def get_bulk_action(action_id: uuid.UUID, principal: Reader, services: ServicesDep) -> BulkActionOut:
    """A bulk action's record and progress (its counts and the last run it processed)."""
    return _out(bulk_action(services.store, action_id, tenant=principal.tenant))


def _out(action: BulkAction) -> BulkActionOut:
    fields = dataclasses.asdict(action)
    fields.pop("tenant")
    limit = fields.pop("max_runs")
    return BulkActionOut(**fields, dry_run=False, limit=limit)


@router.post(
    "/runs/bulk/{action_id}/continue", status_code=202, response_model=BulkActionOut, responses=NOT_FOUND
)
def continue_bulk_action(
    action_id: uuid.UUID, principal: Operator, services: ServicesDep, jobs: JobsDep
) -> BulkActionOut:
    """Work on an action that stopped (its server was stopped or killed) from where it stopped; a run it
    already acted on is not acted on again. An ended action is answered as it is."""
    action = bulk_action(services.store, action_id, tenant=principal.tenant)
    if action.state == "running":
        with jobs.reserve(principal.tenant) as place:
            place.submit(
                f"bulk_{action.kind}",
                bulk_job(services.engine, jobs, action_id, principal.tenant),
                bulk_id=str(action_id),
            )
    return _out(action)

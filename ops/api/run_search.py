"""Finding runs and reading a run's history: `GET /api/v1/runs` and `GET /api/v1/runs/{id}/history`.

The list comes from the run tables (kept by the projector, so it trails the log by its lag), filtered by
workflow, version, status, tags, start and end time, parent run and triggering event, newest first, a
page at a time: each page's `next` is an opaque cursor for the next (keyset, never OFFSET). The history
comes from the run's own stream, exact, a bounded page at a time. Runs of other tenants are not found.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from ops.api.deps import Reader, ServicesDep
from ops.api.errors import NOT_FOUND
from ops.api.read_your_writes import PROJECTION_BEHIND, MinCursor, WaitSeconds, projection_behind
from workflows import RunFilter, run_history, search_runs, tag_filter, workflow_tables

router = APIRouter(tags=["runs"])

RunStatus = Literal["running", "paused", "succeeded", "failed", "cancelled", "continued"]
#: Filters repeated at most this often in one request (tags, statuses).
_MAX_REPEATS = 16


class RunSummaryOut(BaseModel):
    run_id: uuid.UUID
    workflow: str
    workflow_version: str = Field(description="The definition's version the run started with.")
    key: str | None
    status: str
    current_node: str | None
    nodes_total: int
    nodes_done: int
    error: str | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    #: What the run's waiting nodes wait for ("signal approve", "timer"), or None.
    waiting: str | None = None
    tags: dict[str, str] = Field(default_factory=dict, description="The run's tags.")
    parent_run_id: uuid.UUID | None = Field(
        default=None, description="The run whose node started this one (`ctx.start_workflow`)."
    )
    triggered_by: str | None = Field(default=None, description="The id of the log event that started it.")


class RunList(BaseModel):
    runs: list[RunSummaryOut]
    next: str | None = Field(
        default=None,
        description="Pass as `after`, with the same filters, for the next page; null on the last page.",
    )


@router.get("/runs", response_model=RunList, responses=PROJECTION_BEHIND)
async def list_runs(
    request: Request,
    principal: Reader,
    services: ServicesDep,
    status: Annotated[
        list[RunStatus] | None, Query(max_length=_MAX_REPEATS, description="Any of these (repeatable).")
    ] = None,
    workflow: Annotated[str | None, Query(max_length=63)] = None,
    version: Annotated[str | None, Query(max_length=63, description="The definition's version.")] = None,
    tag: Annotated[
        list[str] | None,
        Query(max_length=_MAX_REPEATS, description="`KEY=VALUE`, repeatable: runs carrying every one."),
    ] = None,
    started_after: Annotated[datetime | None, Query(description="Started at or after (with a zone).")] = None,
    started_before: Annotated[datetime | None, Query(description="Started before (with a zone).")] = None,
    ended_after: Annotated[datetime | None, Query(description="Ended at or after (with a zone).")] = None,
    ended_before: Annotated[datetime | None, Query(description="Ended before (with a zone).")] = None,
    parent: Annotated[uuid.UUID | None, Query(description="Children started by this run.")] = None,
    triggered_by: Annotated[
        str | None, Query(max_length=100, description="Started by the log event with this id.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: Annotated[
        str | None, Query(max_length=200, description="The `next` of the previous page.")
    ] = None,
    min_cursor: MinCursor = None,
    wait: WaitSeconds = 5.0,
) -> RunList | JSONResponse:
    """The tenant's runs that every given filter keeps, newest first, a page at a time (from the run
    table, which trails the log slightly; with `min_cursor`, once it shows every write up to that
    cursor). A malformed filter or a cursor of another search is a 422."""
    behind = await projection_behind(request, services, workflow_tables, min_cursor, wait, principal.tenant)
    if behind is not None:
        return behind
    wanted = RunFilter(
        workflow=workflow,
        version=version,
        statuses=tuple(status or ()),
        tags=tag_filter(tag or ()),
        started_after=started_after,
        started_before=started_before,
        ended_after=ended_after,
        ended_before=ended_before,
        parent=parent,
        triggered_by=triggered_by,
    )
    store = services.store

    def answer() -> RunList:
        page = search_runs(store, tenant=principal.tenant, filter=wanted, limit=limit, after=after)
        return RunList(runs=[RunSummaryOut(**r) for r in page.runs], next=page.next)

    return await run_in_threadpool(answer)


class HistoryEntryOut(BaseModel):
    version: int = Field(description="The event's version in the run's stream.")
    position: int = Field(description="The event's position in the log.")
    at: datetime
    type: str = Field(description="The event's type (workflow events without their `wf.` prefix).")
    node: str | None
    attempt: int | None
    worker: str | None
    summary: str = Field(description="A short summary of the payload (at most 160 characters).")
    actor: str | None = None


class HistoryOut(BaseModel):
    run_id: uuid.UUID
    events: list[HistoryEntryOut]
    next: int | None = Field(
        description="Pass as `after` for the next page (a stream version); null once the page reached the "
        "stream's end."
    )


@router.get("/runs/{run_id}/history", response_model=HistoryOut, responses=NOT_FOUND)
def get_history(
    run_id: uuid.UUID,
    principal: Reader,
    services: ServicesDep,
    after: Annotated[int, Query(ge=0, description="Events after this stream version.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> HistoryOut:
    """The run's events, oldest first, from its own stream: time, node, attempt, worker and a summary of
    each; a page stops at `limit` events or 1 MiB of payloads."""
    page = run_history(services.store, run_id, tenant=principal.tenant, after=after, limit=limit)
    return HistoryOut(
        run_id=page.run_id,
        events=[HistoryEntryOut(**e.__dict__) for e in page.entries],
        next=page.next,
    )

"""Projections for operators: health and the safe horizon, runs, rebuild, verify and replay.

Who may pull which lever:
- Health and runs need `read`. A tenant's token sees its own tenant's failure count, and the runs over
  every tenant (without their error text, which may carry any tenant's data) beside its tenant's own;
  a server administrator's sees everything.
- Rebuild, verify and replay need `admin`. A projection every tenant reads (not `per_tenant`) needs a
  server administrator's token: a tenant's admin is refused with 403 and nothing changes. A per-tenant
  projection may be operated by a tenant's admin on that tenant's rows alone; a server administrator acts
  on every tenant's rows.

Each lever records its run at once and answers 202 with the run's id, kind and a note (a replay that
cannot happen in place runs as a rebuild); the work runs in a background thread and the run appears in
`/projections/{name}/runs`. One rebuild, replay or verify per projection and scope runs at a time: a
second request is refused with 409 naming the running run. The jobs wait in the caller's queue (the
server administrator's, or its tenant's; see ops.api.jobs): a full queue is 429, and nothing is recorded.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Query
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from eventstore import Cursor
from ops.api.deps import Admin, JobsDep, Reader, ServicesDep
from ops.api.errors import CONFLICT, NOT_FOUND, TOO_MANY_REQUESTS
from ops.api.jobs import SERVER, Lane, Reservation
from ops.auth import SERVER_ADMIN, Principal
from projector import (
    PendingRun,
    Projection,
    Run,
    find,
    list_runs,
    projection_health,
    start_rebuild,
    start_replay,
    start_verify,
)

router = APIRouter(tags=["projections"])

ProjectionName = Annotated[str, Path(max_length=41)]
_CURSOR_PATTERN = r"^[0-9]{1,19}:[0-9]{1,19}$"
# RFC 3339 date-time with a time zone offset (`T`, `t` or a space between date and time).
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_HIDDEN_ERROR: Final = "(shown to server administrators only: this run covered every tenant)"
#: What the OpenAPI document says the levers need.
_LEVER_SCOPE: Final[dict[str, Any]] = {
    "x-required-scope": ["admin"],
    "x-shared-projection-requires": SERVER_ADMIN,
    "x-required-scope-note": "Requires a token with scope `admin`. For a projection every tenant reads "
    "(not per tenant), only a server administrator's token (`server_admin`); for a per-tenant projection, "
    "a tenant's admin acts on its own tenant's rows and a server administrator on every tenant's.",
}


class SegmentHealthOut(BaseModel):
    segment: int
    cursor: str
    owner: str | None
    open_failures: int


class ProjectionHealthOut(BaseModel):
    name: str
    version: int
    state: str = Field(description="running, catching_up, blocked, rebuilding, replaying, stopped or new.")
    cursor: str
    lag_events: int
    lag_events_head: int
    lag_seconds: float
    owner: str | None
    open_failures: int
    last_run: str | None
    partitions: int = Field(1, description="Segments the projection is applied in (1: unpartitioned).")
    segments: list[SegmentHealthOut] = Field(
        default_factory=list, description="Of a partitioned projection: each segment's cursor and owner."
    )


class HorizonHolderOut(BaseModel):
    pid: int
    application: str
    state: str
    age_seconds: float


class HorizonOut(BaseModel):
    xmin: int
    age_seconds: float = Field(description="How long the oldest holder has held the horizon back.")
    waiting_events: int = Field(description="Committed events not yet readable because of the holders.")
    holders: list[HorizonHolderOut]


class ProjectionsOut(BaseModel):
    projections: list[ProjectionHealthOut]
    horizon: HorizonOut


class ProjectionRunOut(BaseModel):
    id: int
    projection: str
    kind: str
    trigger: str
    actor: str
    status: str
    tenant: str | None = Field(description="The tenant whose rows the run touched; null: every tenant's.")
    events_processed: int
    events_total: int | None = Field(
        description="The events the run goes through, counted when it started (appends made meanwhile take "
        "it a little past); null for catch-up runs."
    )
    rate: float = Field(description="Events per second.")
    seconds_left: float | None = Field(description="At the rate so far, while the run is running.")
    start_cursor: str
    end_cursor: str | None
    target_cursor: str | None
    started_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None
    digest: str | None
    error: str | None = Field(
        description="Why the run failed. A run over every tenant shows it to server administrators only."
    )

    @classmethod
    def of(cls, r: Run, principal: Principal) -> ProjectionRunOut:
        def cursor(tx: int | None, position: int | None) -> str | None:
            return None if tx is None or position is None else str(Cursor(tx, position))

        error = r.error
        if error is not None and r.tenant is None and not principal.server_admin:
            error = _HIDDEN_ERROR
        return cls(
            id=r.id,
            projection=r.projection,
            kind=r.kind,
            trigger=r.trigger,
            actor=r.actor,
            status=r.status,
            tenant=r.tenant,
            events_processed=r.events_processed,
            events_total=r.events_total,
            rate=r.rate,
            seconds_left=r.seconds_left,
            start_cursor=str(Cursor(r.start_tx, r.start_position)),
            end_cursor=cursor(r.end_tx, r.end_position),
            target_cursor=cursor(r.target_tx, r.target_position),
            started_at=r.started_at,
            heartbeat_at=r.heartbeat_at,
            ended_at=r.ended_at,
            digest=r.digest,
            error=error,
        )


class ProjectionRunList(BaseModel):
    runs: list[ProjectionRunOut]


class RunAccepted(BaseModel):
    run_id: int = Field(description="The run; follow it in /projections/{name}/runs.")
    kind: str = Field(description="What runs: rebuild, verify or replay (a replay may run as a rebuild).")
    note: str | None = Field(description="Anything the caller should know, e.g. why a replay rebuilds.")


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after: str | None = Field(
        default=None, pattern=_CURSOR_PATTERN, description="Re-apply events after this cursor."
    )
    since: AwareDatetime | None = Field(
        default=None,
        description="Re-apply events recorded since this time: RFC 3339 with an offset, "
        "e.g. 2024-05-01T12:00:00Z (numbers are refused).",
    )

    @field_validator("since", mode="before")
    @classmethod
    def _rfc3339(cls, value: object) -> object:
        # Before pydantic's own parsing, which would also take a number (or a string of digits) as Unix time.
        if value is not None and not (isinstance(value, str) and _RFC3339.fullmatch(value)):
            raise ValueError("'since' is an RFC 3339 time with an offset, e.g. 2024-05-01T12:00:00Z")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> ReplayRequest:
        if (self.after is None) == (self.since is None):
            raise ValueError("name exactly one of 'after' (a cursor) or 'since' (a time)")
        return self


def _tenant_scope(principal: Principal) -> str | None:
    """The tenant whose data a caller sees: None (every tenant's) for a server administrator."""
    return None if principal.server_admin else principal.tenant


@router.get("/projections", response_model=ProjectionsOut)
def projections(principal: Reader, services: ServicesDep) -> ProjectionsOut:
    """Every projection's state, cursor, lag, owner and failures, and the log's safe horizon.

    A tenant's token sees its own tenant's open failures and last run; a server administrator's, all."""
    health = projection_health(
        services.store,
        services.projections,
        abandoned_after=services.settings.abandoned_after,
        tenant=_tenant_scope(principal),
    )
    horizon = services.store.horizon()
    return ProjectionsOut(
        projections=[ProjectionHealthOut(**h.as_dict()) for h in health],
        horizon=HorizonOut(
            xmin=horizon.xmin,
            age_seconds=horizon.age_seconds,
            waiting_events=horizon.waiting_events,
            # Not the holders' query text: it may carry another tenant's data.
            holders=[
                HorizonHolderOut(
                    pid=h.pid, application=h.application or "", state=h.state or "", age_seconds=h.age_seconds
                )
                for h in horizon.holders
            ],
        ),
    )


@router.get("/projections/{name}/runs", response_model=ProjectionRunList, responses=NOT_FOUND)
def projection_runs(
    name: ProjectionName,
    principal: Reader,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
) -> ProjectionRunList:
    """The projection's recent catch-up, replay, rebuild and verify runs, newest first: for a tenant's
    token, the runs over every tenant and its own tenant's, never another tenant's."""
    projection = find(services.projections, name)
    with services.store.connection() as conn:
        runs = list_runs(conn, projection.name, limit, tenant=_tenant_scope(principal))
    return ProjectionRunList(runs=[ProjectionRunOut.of(r, principal) for r in runs])


def _operated_scope(projection: Projection, principal: Principal, lever: str) -> str | None:
    """The tenant whose rows the lever touches (None: every tenant's); 403 for a tenant's token on a
    projection every tenant reads."""
    if principal.server_admin:
        return None
    if not projection.per_tenant:
        principal.require_server_admin(f"{lever} {projection.name!r}, which every tenant reads,")
    return principal.tenant


def _lane(principal: Principal) -> Lane:
    """The job queue a lever waits in: the server administrator's, ahead of every tenant's, or the
    tenant's own."""
    return SERVER if principal.server_admin else principal.tenant


def _accept(pending: PendingRun, place: Reservation) -> RunAccepted:
    """Queue the recorded run in the caller's job lane; answer with the run at once. Its heartbeat starts
    now, so a run that waits for a job thread is not taken for abandoned."""
    pending.start_heartbeats()
    place.submit(pending.kind, pending.execute, projection=pending.projection.name, run_id=pending.run_id)
    return RunAccepted(run_id=pending.run_id, kind=pending.kind, note=pending.note)


_LEVER_RESPONSES = {**NOT_FOUND, **CONFLICT, **TOO_MANY_REQUESTS}


@router.post(
    "/projections/{name}/rebuild",
    status_code=202,
    response_model=RunAccepted,
    responses=_LEVER_RESPONSES,
    openapi_extra=_LEVER_SCOPE,
)
def rebuild_projection(
    name: ProjectionName, principal: Admin, services: ServicesDep, jobs: JobsDep
) -> RunAccepted:
    """Rebuild from the whole log in a shadow schema and swap it in atomically (in the background)."""
    projection = find(services.projections, name)
    tenant = _operated_scope(projection, principal, "rebuilding")
    with jobs.reserve(_lane(principal)) as place:
        pending = start_rebuild(
            services.store,
            projection,
            actor=f"api:{principal.token_id}",
            tenant=tenant,
            batch_size=services.settings.projector_batch_size,
        )
        return _accept(pending, place)


@router.post(
    "/projections/{name}/verify",
    status_code=202,
    response_model=RunAccepted,
    responses=_LEVER_RESPONSES,
    openapi_extra=_LEVER_SCOPE,
)
def verify_projection(
    name: ProjectionName, principal: Admin, services: ServicesDep, jobs: JobsDep
) -> RunAccepted:
    """Rebuild in a scratch schema and compare digests with the live tables (in the background)."""
    projection = find(services.projections, name)
    tenant = _operated_scope(projection, principal, "verifying")
    with jobs.reserve(_lane(principal)) as place:
        pending = start_verify(
            services.store,
            projection,
            actor=f"api:{principal.token_id}",
            tenant=tenant,
            batch_size=services.settings.projector_batch_size,
        )
        return _accept(pending, place)


@router.post(
    "/projections/{name}/replay",
    status_code=202,
    response_model=RunAccepted,
    responses=_LEVER_RESPONSES,
    openapi_extra=_LEVER_SCOPE,
)
def replay_projection(
    name: ProjectionName, body: ReplayRequest, principal: Admin, services: ServicesDep, jobs: JobsDep
) -> RunAccepted:
    """Re-apply the events after a cursor (or since a time). A projection that cannot be replayed in
    place, or one tenant's rows, are rebuilt instead (`kind` and `note` say so)."""
    projection = find(services.projections, name)
    tenant = _operated_scope(projection, principal, "replaying")
    with jobs.reserve(_lane(principal)) as place:
        pending = start_replay(
            services.store,
            projection,
            after=Cursor.parse(body.after) if body.after is not None else None,
            since=body.since,
            actor=f"api:{principal.token_id}",
            tenant=tenant,
            batch_size=services.settings.projector_batch_size,
        )
        return _accept(pending, place)

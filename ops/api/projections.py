"""Projections for operators: health and the safe horizon, runs, rebuild, verify and replay.

Health is global (it names no tenant's data) and needs `read`; actions change what every tenant sees,
so they need `admin`. Rebuild and verify run in a background thread and answer 202 at once: the run
they record appears in `/projections/{name}/runs`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from eventstore import Cursor
from eventstore.db import translate_errors
from eventstore.errors import ConflictError
from ops.api.deps import Admin, JobsDep, Reader, ServicesDep
from ops.api.errors import CONFLICT, NOT_FOUND
from ops.api.jobs import BackgroundJobs
from ops.auth import Principal
from ops.services import Services
from projector import Projection, rebuild, replay, verify
from projector import state as projector_state
from projector.health import projection_health
from projector.registry import find

router = APIRouter(tags=["projections"])

ProjectionName = Annotated[str, Path(max_length=41)]
_CURSOR_PATTERN = r"^[0-9]{1,19}:[0-9]{1,19}$"


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
    events_processed: int
    rate: float = Field(description="Events per second.")
    start_cursor: str
    end_cursor: str | None
    target_cursor: str | None
    started_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None
    digest: str | None
    error: str | None

    @classmethod
    def of(cls, r: projector_state.Run) -> ProjectionRunOut:
        def cursor(tx: int | None, position: int | None) -> str | None:
            return None if tx is None or position is None else str(Cursor(tx, position))

        return cls(
            id=r.id,
            projection=r.projection,
            kind=r.kind,
            trigger=r.trigger,
            actor=r.actor,
            status=r.status,
            events_processed=r.events_processed,
            rate=r.rate,
            start_cursor=str(Cursor(r.start_tx, r.start_position)),
            end_cursor=cursor(r.end_tx, r.end_position),
            target_cursor=cursor(r.target_tx, r.target_position),
            started_at=r.started_at,
            heartbeat_at=r.heartbeat_at,
            ended_at=r.ended_at,
            digest=r.digest,
            error=r.error,
        )


class ProjectionRunList(BaseModel):
    runs: list[ProjectionRunOut]


class Accepted(BaseModel):
    accepted: bool


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after: str | None = Field(
        default=None, pattern=_CURSOR_PATTERN, description="Re-apply events after this cursor."
    )
    since: AwareDatetime | None = Field(default=None, description="Re-apply events recorded since this time.")

    @model_validator(mode="after")
    def _exactly_one(self) -> ReplayRequest:
        if (self.after is None) == (self.since is None):
            raise ValueError("name exactly one of 'after' (a cursor) or 'since' (a time)")
        return self


class ReplayOut(BaseModel):
    run_id: int


@router.get("/projections", response_model=ProjectionsOut)
def projections(principal: Reader, services: ServicesDep) -> ProjectionsOut:
    """Every projection's state, cursor, lag, owner and failures, and the log's safe horizon."""
    with translate_errors():
        health = projection_health(
            services.store, services.projections, abandoned_after=services.settings.abandoned_after
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
    """The projection's recent catch-up, replay, rebuild and verify runs, newest first."""
    projection = find(services.projections, name)
    with translate_errors(), services.store.pool.connection() as conn:
        runs = projector_state.list_runs(conn, projection.name, limit)
    return ProjectionRunList(runs=[ProjectionRunOut.of(r) for r in runs])


def _refuse_if_running(services: Services, projection: Projection, *kinds: projector_state.RunKind) -> None:
    """A fast, friendly 409. (Two requests racing past it still cannot both rebuild: the database allows
    one running rebuild or replay per projection, and the loser's job fails and is logged.)"""
    with translate_errors(), services.store.pool.connection() as conn:
        for kind in kinds:
            running = projector_state.active_run(conn, projection.name, kind)
            if running is not None:
                raise ConflictError(
                    f"a {kind} of {projection.name!r} is already running (run {running[0]}); "
                    "wait for it to finish"
                )


def _in_background(
    kind: str,
    operation: Callable[..., object],
    name: str,
    principal: Principal,
    services: Services,
    jobs: BackgroundJobs,
    exclusive: tuple[projector_state.RunKind, ...],
) -> Accepted:
    """Start a rebuild or verify of `name` in a job thread, unless one that excludes it is running."""
    projection = find(services.projections, name)
    _refuse_if_running(services, projection, *exclusive)
    actor = f"api:{principal.token_id}"
    batch = services.settings.projector_batch_size
    jobs.submit(
        kind,
        lambda: operation(services.store, projection, actor=actor, batch_size=batch),
        projection=projection.name,
    )
    return Accepted(accepted=True)


@router.post(
    "/projections/{name}/rebuild",
    status_code=202,
    response_model=Accepted,
    responses={**NOT_FOUND, **CONFLICT},
)
def rebuild_projection(
    name: ProjectionName, principal: Admin, services: ServicesDep, jobs: JobsDep
) -> Accepted:
    """Rebuild from the whole log in a shadow schema and swap it in atomically (in the background)."""
    return _in_background("rebuild", rebuild, name, principal, services, jobs, ("rebuild", "replay"))


@router.post(
    "/projections/{name}/verify",
    status_code=202,
    response_model=Accepted,
    responses={**NOT_FOUND, **CONFLICT},
)
def verify_projection(
    name: ProjectionName, principal: Admin, services: ServicesDep, jobs: JobsDep
) -> Accepted:
    """Rebuild in a scratch schema and compare digests with the live tables (in the background)."""
    return _in_background("verify", verify, name, principal, services, jobs, ("verify",))


@router.post(
    "/projections/{name}/replay",
    status_code=202,
    response_model=ReplayOut,
    responses={**NOT_FOUND, **CONFLICT},
)
def replay_projection(
    name: ProjectionName, body: ReplayRequest, principal: Admin, services: ServicesDep
) -> ReplayOut:
    """Move the cursor back; the projector holding the lease re-applies from there and completes the run."""
    projection = find(services.projections, name)
    run_id = replay(
        services.store,
        projection,
        after=Cursor.parse(body.after) if body.after is not None else None,
        since=body.since,
        actor=f"api:{principal.token_id}",
    )
    return ReplayOut(run_id=run_id)

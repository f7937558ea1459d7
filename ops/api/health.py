"""Liveness and readiness probes: `/api/healthz` and `/api/readyz` (no token needed).

healthz: the process runs and the database answers `SELECT 1`. readyz: every migration is applied (then
200, else 503); it also reports whether projectors and workflow workers are seen at work, which an
operator wants to know but which does not make this API unready (it serves without them). Both answer on
the event loop from the server's own background check (`probes.DatabaseMonitor`, every
LEDGERFLOW_HEALTH_CHECK_INTERVAL seconds on a connection of its own): no query per probe, and never behind
other requests for a thread or a pool connection. Both list the worker roles run by this process
(`ledgerflow serve`): running, waiting for the database (since when, and why), or restarting after dying
(how often, and why).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from eventstore import LedgerflowError
from ops.api import probes
from ops.api.deps import ApiSettingsDep, ServicesDep
from ops.services import Services

log = structlog.get_logger(__name__)
router = APIRouter(tags=["health"])


class RoleOut(BaseModel):
    """A worker role run by this process (`ledgerflow serve`)."""

    name: str
    state: Literal["starting", "running", "waiting_for_database", "restarting", "stopped"]
    restarts: int = Field(description="How often the role died and was started again.")
    last_error: str | None = Field(default=None, description="Why it last died, if it did.")
    waiting_for_database_since: datetime | None = None
    waiting_seconds: float | None = None
    database_error: str | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "unavailable"]
    reason: str | None = None
    roles: list[RoleOut] | None = Field(
        default=None, description="The worker roles this process runs; absent when it runs none."
    )


class MigrationOut(BaseModel):
    version: int
    name: str


class MigrationsOut(BaseModel):
    applied: list[int]
    pending: list[MigrationOut]


class ProjectorsOut(BaseModel):
    active: bool = Field(description="Some projection has a live lease owner.")
    projections_with_live_owner: list[str]


class WorkersOut(BaseModel):
    active: bool = Field(description="Some workflow worker holds a node lease or swept for orphans lately.")
    live: int


class ReadyOut(BaseModel):
    status: Literal["ready", "not_ready", "unavailable"]
    reason: str | None = None
    migrations: MigrationsOut | None = None
    projectors: ProjectorsOut | None = None
    workers: WorkersOut | None = None
    roles: list[RoleOut] | None = Field(
        default=None, description="The worker roles this process runs; absent when it runs none."
    )


def _json(model: HealthOut | ReadyOut, status: int) -> JSONResponse:
    body = model.model_dump(mode="json", exclude={"roles"} if model.roles is None else None)
    return JSONResponse(body, status_code=status)


def _roles(services: Services) -> list[RoleOut] | None:
    if not services.roles:
        return None
    out = []
    for role in services.roles:
        r = role.report()
        out.append(
            RoleOut(
                name=r.name,
                state=r.state,
                restarts=r.restarts,
                last_error=r.last_error,
                waiting_for_database_since=r.database.since,
                waiting_seconds=r.database.seconds if r.database.waiting else None,
                database_error=r.database.error,
            )
        )
    return out


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "The database does not answer."}},
)
async def healthz(request: Request, services: ServicesDep, settings: ApiSettingsDep) -> JSONResponse:
    """200 when the API runs and the database answers; 503 otherwise. Lists the worker roles this
    process runs, with their state (a role waiting for the database says since when).

    Answers on the event loop from what the server already knows (its own check of the database, every
    LEDGERFLOW_HEALTH_CHECK_INTERVAL seconds on a connection of its own), so busy requests, a full thread
    pool or a full connection pool never delay it."""
    monitor = getattr(request.app.state, "monitor", None)
    known = monitor.state() if isinstance(monitor, probes.DatabaseMonitor) else None
    if services.store.pool.closed:
        known = (False, "the connection pool is closed")
    elif known is None:  # not checked yet (the app's lifespan has not run): ask now
        try:
            await run_in_threadpool(probes.ping, services.store, settings.probe_timeout)
            known = (True, "")
        except LedgerflowError as exc:
            known = (False, str(exc))
    answers, reason = known
    if not answers:
        log.warning("api_health_failed", error=reason)
        return _json(HealthOut(status="unavailable", reason=reason, roles=_roles(services)), 503)
    return _json(HealthOut(status="ok", roles=_roles(services)), 200)


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "Migrations are pending, or the database is down."}},
)
async def readyz(request: Request, services: ServicesDep, settings: ApiSettingsDep) -> JSONResponse:
    """200 when every migration is applied; reports projector and workflow worker activity.

    Answers on the event loop from the server's last background check (as healthz does), at most about
    LEDGERFLOW_HEALTH_CHECK_INTERVAL seconds old."""
    monitor = getattr(request.app.state, "monitor", None)
    known = monitor.readiness() if isinstance(monitor, probes.DatabaseMonitor) else None
    if services.store.pool.closed:
        known = "the connection pool is closed"
    elif known is None:  # not checked yet (the app's lifespan has not run): ask now
        try:
            known = await run_in_threadpool(
                probes.readiness,
                services.store,
                [p.name for p in services.projections],
                recent_seconds=recent_workers(services),
                timeout=settings.probe_timeout,
            )
        except LedgerflowError as exc:
            known = str(exc)
    if isinstance(known, str):
        log.warning("api_readiness_failed", error=known)
        return _json(ReadyOut(status="unavailable", reason=known, roles=_roles(services)), 503)
    migrations = _migrations_out(known.migrations)
    if known.migrations.pending:
        body = ReadyOut(
            status="not_ready",
            reason=f"{len(known.migrations.pending)} migration(s) pending; run the migrations",
            migrations=migrations,
        )
        return _json(body, 503)
    owned = known.projection_owners
    body = ReadyOut(
        status="ready",
        migrations=migrations,
        projectors=ProjectorsOut(active=bool(owned), projections_with_live_owner=owned),
        workers=WorkersOut(active=bool(known.workers), live=len(known.workers)),
        roles=_roles(services),
    )
    return _json(body, 200)


def recent_workers(services: Services) -> float:
    """How lately a worker must have swept to count as alive: it sweeps on start-up, and twice the
    abandonment window counts as "lately"."""
    return 2 * services.settings.abandoned_after


def _migrations_out(status: probes.MigrationStatus) -> MigrationsOut:
    return MigrationsOut(
        applied=status.applied,
        pending=[MigrationOut(version=m.version, name=m.name) for m in status.pending],
    )

"""Projection failures (`/api/v1/failures`): events a projection could not apply, to retry or skip.

A failure is its event's tenant's data: a tenant's `admin` token lists, retries and skips only its own
tenant's failures (another tenant's is not found), a server administrator's every tenant's.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel

from eventstore import NotFoundError
from ops.api.deps import Admin, ServicesDep
from ops.api.errors import NOT_FOUND
from ops.auth import Principal
from ops.services import Services
from projector import (
    Failure,
    find,
    request_failure_retry,
    request_failure_skip,
)
from projector import (
    list_failures as failure_records,
)

router = APIRouter(tags=["projections"])

FailureId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class FailureOut(BaseModel):
    id: int
    projection: str
    event_position: int
    event_id: uuid.UUID
    tenant: str
    stream_id: str
    stream_version: int
    event_type: str
    policy: str
    status: str
    error_class: str
    error_message: str
    attempts: int
    first_seen: datetime
    last_seen: datetime
    resolved_at: datetime | None
    resolved_by: str | None

    @classmethod
    def of(cls, f: Failure) -> FailureOut:
        fields = {name: getattr(f, name) for name in cls.model_fields}
        return cls(**fields)


class FailureList(BaseModel):
    failures: list[FailureOut]


class FailureActionOut(BaseModel):
    id: int
    requested: Literal["retry", "skip"]


@router.get("/failures", response_model=FailureList, responses=NOT_FOUND)
def list_failures(
    principal: Admin,
    services: ServicesDep,
    projection: Annotated[str | None, Query(max_length=41)] = None,
    all: Annotated[bool, Query(description="Include resolved and skipped failures.")] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> FailureList:
    """Open failures (with `all`, resolved and skipped ones too), newest first: the token's tenant's, or
    every tenant's for a server administrator."""
    name = find(services.projections, projection).name if projection is not None else None
    with services.store.connection() as conn:
        found = failure_records(conn, name, include_closed=all, limit=limit, tenant=_tenant_scope(principal))
    return FailureList(failures=[FailureOut.of(f) for f in found])


def _tenant_scope(principal: Principal) -> str | None:
    return None if principal.server_admin else principal.tenant


def _resolve(
    services: Services, failure_id: int, action: Literal["retry", "skip"], principal: Principal
) -> None:
    request = request_failure_retry if action == "retry" else request_failure_skip
    actor = f"api:{principal.token_id}"
    with services.store.connection() as conn:
        # Scoped in the statement itself: another tenant's failure is not found, and nothing changes.
        if not request(conn, failure_id, actor, tenant=_tenant_scope(principal)):
            raise NotFoundError(
                f"no open failure #{failure_id}; list them with GET /api/v1/failures?all=true"
            )


@router.post("/failures/{failure_id}/retry", response_model=FailureActionOut, responses=NOT_FOUND)
def retry_failure(failure_id: FailureId, principal: Admin, services: ServicesDep) -> FailureActionOut:
    """Ask the projector holding the lease to apply the failed event again."""
    _resolve(services, failure_id, "retry", principal)
    return FailureActionOut(id=failure_id, requested="retry")


@router.post("/failures/{failure_id}/skip", response_model=FailureActionOut, responses=NOT_FOUND)
def skip_failure(failure_id: FailureId, principal: Admin, services: ServicesDep) -> FailureActionOut:
    """Ask the projector holding the lease to skip the failed event (recorded, never silent)."""
    _resolve(services, failure_id, "skip", principal)
    return FailureActionOut(id=failure_id, requested="skip")

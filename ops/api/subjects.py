"""Forgetting a subject (`/api/v1/subjects/{subject}/forget`): its data key is deleted, so its personal
fields read as `[forgotten]` from then on, in the log, the projections rebuilt from it and this API.

A tenant's administrator forgets subjects of its own tenant; a server administrator, of any tenant
(`?tenant=`). The forgetting is recorded in the tenant's log (stream `subjects-forgotten`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from eventstore import check_tenant, forget_subject
from ops.api.deps import Admin, ServicesDep
from ops.api.errors import CONFLICT

router = APIRouter(tags=["subjects"])

Subject = Annotated[
    str, Path(min_length=1, max_length=256, description="The subject's id, as in its events.")
]


class ForgetRequest(BaseModel):
    reason: str = Field(default="", max_length=1000, description="Why, recorded with the forgetting.")


class SubjectForgotten(BaseModel):
    tenant: str
    subject: str
    key_id: str = Field(description="The id of the deleted data key (the one in the sealed fields).")
    forgotten_at: datetime
    already: bool = Field(description="True when the subject had been forgotten before: nothing changed.")


@router.post("/subjects/{subject}/forget", response_model=SubjectForgotten, responses=CONFLICT)
async def forget(
    subject: Subject,
    principal: Admin,
    services: ServicesDep,
    body: ForgetRequest | None = None,
    tenant: Annotated[
        str | None,
        Query(max_length=63, description="Another tenant's subject (server administrators only)."),
    ] = None,
) -> SubjectForgotten:
    """Delete the subject's data key in the tenant: its personal fields read as `[forgotten]` from now
    on; every other field, and the events' ids and positions, stay as they are. Repeating it is a no-op."""
    scope = check_tenant(tenant) if tenant is not None else principal.tenant
    if scope != principal.tenant:
        principal.require_server_admin(f"forgetting a subject of tenant {scope!r}")
    reason = body.reason if body is not None else ""

    def run() -> SubjectForgotten:
        done = forget_subject(
            services.store, subject, tenant=scope, by=f"api:{principal.token_id}", reason=reason
        )
        return SubjectForgotten(
            tenant=done.tenant,
            subject=done.subject,
            key_id=str(done.key_id),
            forgotten_at=done.forgotten_at,
            already=done.already,
        )

    return await run_in_threadpool(run)

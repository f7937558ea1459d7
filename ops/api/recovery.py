"""Workflow recovery for operators (`/api/v1/recovery`): the queue's state and recent recovery sweeps.

Counts only, across tenants: no run or tenant is named, so `read` is enough.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from ops.api.deps import Reader, ServicesDep
from workflows import queue_summary, recent_recoveries

router = APIRouter(tags=["runs"])


class QueueOut(BaseModel):
    ready: int = Field(description="Nodes waiting for a worker.")
    running: int = Field(description="Nodes claimed under a live lease.")
    orphaned: int = Field(description="Nodes claimed under a lapsed lease: recovery reclaims them.")
    parked: int = Field(description="Nodes that crashed too often and wait for an operator.")


class RecoveryOut(BaseModel):
    id: int
    worker: str
    trigger: str
    started_at: datetime
    duration_ms: float
    found: int
    reclaimed: int
    parked: int
    stuck: int
    failed: int


class RecoveryReport(BaseModel):
    queue: QueueOut
    recent: list[RecoveryOut]


@router.get("/recovery", response_model=RecoveryReport)
def recovery(
    principal: Reader, services: ServicesDep, limit: Annotated[int, Query(ge=1, le=200)] = 20
) -> RecoveryReport:
    """The scheduler queue (ready, running, orphaned, parked) and the most recent recovery sweeps."""
    with services.store.connection() as conn:
        summary = queue_summary(conn)
        recent = recent_recoveries(conn, limit)
    return RecoveryReport(
        queue=QueueOut(
            ready=summary.ready, running=summary.running, orphaned=summary.orphaned, parked=summary.parked
        ),
        recent=[RecoveryOut(**asdict(r)) for r in recent],
    )

"""Limits per key (`/api/v1/limits`): each limit's bounds, slots in use and nodes waiting.

Limits are shared by every worker and every tenant, so the counts are across tenants; no run or tenant is
named, so `read` is enough. The same counts are the metrics `ledgerflow.workflow.limit_in_use` and
`ledgerflow.workflow.limit_waiting`, reported by the process that serves the API.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from ops.api.deps import Reader, ServicesDep
from ops.services import Services
from workflows import limit_usage, watch_limit_usage

router = APIRouter(tags=["runs"])


class LimitOut(BaseModel):
    name: str
    concurrency: int | None = Field(description="Nodes of this limit that may run at once; null: unbounded.")
    per_minute: int | None = Field(description="Starts allowed in any sliding minute; null: unbounded.")
    in_use: int = Field(description="Nodes of this limit running now, on every worker (slots in use).")
    waiting: int = Field(description="Ready nodes of this limit, waiting for a slot or a worker.")
    started_last_minute: int = Field(description="Starts counted against per_minute in the last minute.")
    declared_by: str = Field(description="The worker whose declaration is in force (the last to start).")
    declared_at: datetime


class LimitsReport(BaseModel):
    limits: list[LimitOut]


@router.get("/limits", response_model=LimitsReport)
def limits(principal: Reader, services: ServicesDep) -> LimitsReport:
    """Every declared limit with its slots in use, the nodes waiting, and its starts in the last minute."""
    found = limit_usage(services.store.pool)
    return LimitsReport(limits=[LimitOut(**asdict(u)) for u in found])


@contextmanager
def limit_metrics(services: Services) -> Iterator[None]:
    """While the API runs, its process reports the limits' gauges from `services`' database."""
    watch_limit_usage(lambda: limit_usage(services.store.pool))
    try:
        yield
    finally:
        watch_limit_usage(None)

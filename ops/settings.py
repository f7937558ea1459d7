"""ledgerflow's settings, from LEDGERFLOW_* environment variables."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field

from eventstore import DatabaseSettings


class Settings(DatabaseSettings):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    #: Extra projections, as comma-separated `module:attribute` import paths.
    projections: str = ""
    #: Projector leases: how long one lasts without renewal, and how often it is renewed.
    projector_lease_ttl: float = Field(default=10.0, gt=0)
    projector_heartbeat_interval: float = Field(default=3.0, gt=0)
    projector_batch_size: int = Field(default=1000, ge=1, le=100_000)
    #: A run whose owner has not heartbeated for this long is marked abandoned.
    abandoned_after: float = Field(default=30.0, gt=0)

    #: Workflow definitions, as comma-separated `module:attribute` import paths.
    workflows: str = ""
    #: A workflow worker's name, stable across restarts (give each worker on a host its own).
    worker_name: str = Field(default_factory=socket.gethostname)
    worker_concurrency: int = Field(default=4, ge=1, le=1000)
    #: `async def` nodes a worker runs at once on its event loop (apart from its threads), and the threads
    #: that carry their database calls.
    worker_async_concurrency: int = Field(default=100, ge=1, le=100_000)
    worker_async_io_threads: int = Field(default=4, ge=1, le=256)
    #: On SIGTERM, how long running nodes have to reach a context call (which hands them back) before
    #: the worker hands back whatever still runs and exits.
    worker_shutdown_grace: float = Field(default=10.0, gt=0)
    #: On SIGTERM, how long the steps that need the database (a last heartbeat, handing nodes back,
    #: releasing leases) may wait for it; past that they are skipped and the leases lapse by themselves,
    #: so that every role ends within its grace whether the database answers or not.
    shutdown_database_timeout: float = Field(default=3.0, gt=0, le=60)
    workflow_lease_ttl: float = Field(default=10.0, gt=0)
    workflow_heartbeat_interval: float = Field(default=2.0, gt=0)
    recovery: bool = True
    recovery_interval: float = Field(default=2.0, gt=0)

    #: Per-tenant quotas (None: unbounded); a tenant's row in ledgerflow.tenant_quotas overrides them (see
    #: workflows.quotas). Runs in flight and the rates hold across processes.
    tenant_max_runs_in_flight: int | None = Field(default=None, ge=1)
    tenant_starts_per_second: float | None = Field(default=None, gt=0)
    tenant_appends_per_second: float | None = Field(default=None, gt=0)
    #: Seconds' worth of a rate a tenant may use at once after a quiet spell (at least one request).
    tenant_rate_burst: float = Field(default=1.0, gt=0)
    #: How long a process keeps what it read of ledgerflow.tenant_quotas (seconds).
    tenant_quotas_refresh: float = Field(default=5.0, gt=0)

    #: The most runs one bulk operator action (`workflows bulk`, `POST /api/v1/runs/bulk/...`) takes.
    bulk_max_runs: int = Field(default=10_000, ge=1, le=10_000_000)
    #: The API server works a bulk action nothing has advanced for this long (seconds): one whose process
    #: was killed, the server's own included. It looks for them on start and at this interval.
    bulk_resume_after: float = Field(default=10.0, gt=0, le=3600)
    #: How long a command that works through many runs (`workflows bulk ...`, `bulk continue`, `workflows
    #: retention`) waits for a database that went away mid-way (a restart) before it stops, resumable
    #: (seconds). Servers wait for as long as it takes.
    outage_wait: float = Field(default=60.0, ge=0, le=86_400)

    @property
    def projection_paths(self) -> list[str]:
        return _split(self.projections)

    @property
    def workflow_paths(self) -> list[str]:
        return _split(self.workflows)


def _split(paths: str) -> list[str]:
    return [p.strip() for p in paths.split(",") if p.strip()]

"""The API's own settings, from LEDGERFLOW_* environment variables.

They belong in `ops.settings.Settings`; until they move there they are read here, so the API can be
configured the same way as the rest of ledgerflow.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGERFLOW_", extra="ignore")

    #: The largest request body the API reads (bytes); larger ones are refused with 413.
    max_request_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    #: Seconds a health probe waits for a database connection before answering 503.
    probe_timeout: float = Field(default=2.0, gt=0)
    #: The largest request head (request line and headers, bytes); a larger one is answered 400 and the
    #: connection closed before more of it is kept (`ledgerflow serve`).
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=1024 * 1024)
    #: Connections and requests `ledgerflow serve` keeps open at once; beyond them it answers 503.
    max_connections: int = Field(default=1000, ge=1)
    #: Connections the operating system queues for `ledgerflow serve` before it accepts them.
    listen_backlog: int = Field(default=2048, ge=1)
    #: Requests waiting at once (reads waiting for `min_cursor`, waits for a run's end), in total and per
    #: tenant; beyond them 429 with Retry-After.
    max_projection_waiters: int = Field(default=200, ge=1)
    max_projection_waiters_per_tenant: int = Field(default=20, ge=1)
    #: Requests of one tenant in flight at once (a request waiting for `min_cursor` or a run's end does not
    #: count while it waits, and comes back through the line); beyond, a request waits in its tenant's
    #: line. Below the connection pool, so no tenant holds all of it.
    max_requests_per_tenant: int = Field(default=8, ge=1)
    #: Requests of one tenant that wait in its line, past its requests in flight; more are refused (429).
    max_queued_requests_per_tenant: int = Field(default=256, ge=0)
    #: Seconds a request waits in its tenant's line before it is refused (429).
    request_queue_seconds: float = Field(default=30.0, gt=0, le=300)
    #: Seconds the API keeps what a token lookup found (a live token, or a refusal); a revoked token stops
    #: working within this time. 0: every request looks its token up.
    token_cache_seconds: float = Field(default=5.0, ge=0, le=300)
    #: Tokens kept at most (live ones, and refusals apart).
    token_cache_size: int = Field(default=10_000, ge=1)
    #: How often the server checks the database on a connection of its own; `/api/healthz` answers from
    #: the last check.
    health_check_interval: float = Field(default=1.0, gt=0, le=60)
    #: Threads that carry operator jobs (rebuild, verify, replay); one tenant's jobs run one at a time.
    api_job_threads: int = Field(default=2, ge=1, le=64)
    #: Operator jobs a tenant (or the server administrator) may have waiting; more are refused with 429.
    api_max_queued_jobs: int = Field(default=8, ge=1, le=10_000)

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
    #: Threads that carry operator jobs (rebuild, verify, replay); one tenant's jobs run one at a time.
    api_job_threads: int = Field(default=2, ge=1, le=64)
    #: Operator jobs a tenant (or the server administrator) may have waiting; more are refused with 429.
    api_max_queued_jobs: int = Field(default=8, ge=1, le=10_000)

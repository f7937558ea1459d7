"""ledgerflow's settings, from LEDGERFLOW_* environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eventstore.settings import DatabaseSettings


class Settings(DatabaseSettings):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    #: Extra projections, as comma-separated `module:attribute` import paths.
    projections: str = ""
    #: Projector leases: how long one lasts without renewal, and how often it is renewed.
    projector_lease_ttl: float = Field(default=10.0, gt=0)
    projector_heartbeat_interval: float = Field(default=3.0, gt=0)
    projector_batch_size: int = Field(default=500, ge=1, le=100_000)
    #: A run whose owner has not heartbeated for this long is marked abandoned.
    abandoned_after: float = Field(default=30.0, gt=0)

    @property
    def projection_paths(self) -> list[str]:
        return [p.strip() for p in self.projections.split(",") if p.strip()]

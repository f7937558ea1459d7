"""ledgerflow's settings, from LEDGERFLOW_* environment variables."""

from __future__ import annotations

from typing import Literal

from eventstore.settings import DatabaseSettings


class Settings(DatabaseSettings):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"

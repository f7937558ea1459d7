"""ledgerflow's HTTP API (FastAPI): events, workflow runs, projections, health."""

from ops.api.app import create_app

__all__ = ["create_app"]

"""Tokens of both kinds of administrator, for the API tests."""

from __future__ import annotations

from ops.auth import create_token
from ops.services import Services
from tests.api.helpers import Headers


def server_admin(services: Services, tenant: str = "default") -> Headers:
    """Headers carrying a fresh server administrator's token."""
    _, secret = create_token(services.store, tenant=tenant, scopes=["admin"], name="ops", server_admin=True)
    return {"Authorization": f"Bearer {secret}"}


def tenant_admin(services: Services, tenant: str) -> Headers:
    """Headers carrying a fresh `admin` token of `tenant` (no server role)."""
    _, secret = create_token(services.store, tenant=tenant, scopes=["admin"], name=f"{tenant}-admin")
    return {"Authorization": f"Bearer {secret}"}

"""The HTTP API through the real ASGI app, on a fresh migrated database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ops.api import create_app
from ops.auth import create_token
from ops.services import Services, open_services
from ops.settings import Settings
from tests.api.helpers import Headers, MakeToken


@pytest.fixture
def services(database_url: str) -> Iterator[Services]:
    opened = open_services(Settings(database_url=database_url, workflows="tests.flows:registry"))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def app(services: Services) -> FastAPI:
    return create_app(services)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    # As a context manager, so the app's lifespan runs (and waits for background jobs at the end).
    with TestClient(app) as c:
        yield c


@pytest.fixture
def make_token(services: Services) -> MakeToken:
    """Headers carrying a fresh token: `make_token("read", tenant="acme")`."""

    def make(*scopes: str, tenant: str = "acme") -> Headers:
        _, secret = create_token(services.store, tenant=tenant, scopes=scopes or ("admin",), name="test")
        return {"Authorization": f"Bearer {secret}"}

    return make


@pytest.fixture
def admin(make_token: MakeToken) -> Headers:
    return make_token("admin")

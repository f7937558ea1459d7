"""healthz and readyz list the worker roles a `serve` process runs, and show one waiting for the
database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from eventstore.outage import OutageState
from ops.roles import Role
from ops.services import Services
from tests.waiting import wait_until


class _Waiting:
    """A worker that is waiting for its database."""

    def __init__(self) -> None:
        self.stopping = threading.Event()

    def run(self) -> None:
        self.stopping.wait()

    def stop(self) -> None:
        self.stopping.set()

    def database_state(self) -> OutageState:
        return OutageState(
            waiting=True, since=datetime.now(UTC), seconds=4.2, error="connection refused", outages=1
        )


@pytest.fixture
def waiting_role(services: Services) -> Iterator[Role]:
    role = Role("projector", _Waiting)
    services.roles.append(role)
    role.start()
    wait_until(lambda: role.report().state != "starting", what="the role to start")
    yield role
    role.stop()
    role.join(5)
    services.roles.clear()


def test_healthz_shows_a_role_waiting_for_the_database(client: TestClient, waiting_role: Role) -> None:
    body = client.get("/api/healthz").json()
    assert body["status"] == "ok"
    [role] = body["roles"]
    assert role["name"] == "projector"
    assert role["state"] == "waiting_for_database"
    assert role["waiting_seconds"] == 4.2
    assert role["database_error"] == "connection refused"
    assert role["waiting_for_database_since"] is not None
    assert role["restarts"] == 0


def test_readyz_lists_the_roles_too(client: TestClient, waiting_role: Role) -> None:
    body = client.get("/api/readyz").json()
    assert [r["state"] for r in body["roles"]] == ["waiting_for_database"]

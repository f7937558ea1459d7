"""API tokens (ops.auth) and access control over HTTP: 401 without a live token, 403 without the scope."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from eventstore import InvalidInputError
from ops.auth import (
    AuthenticationError,
    PermissionDeniedError,
    authenticate,
    create_token,
    list_tokens,
    revoke_token,
)
from ops.services import Services
from tests.api.helpers import Headers, MakeToken, event_count, events_body


def test_a_token_is_shown_once_and_only_its_hash_is_stored(services: Services, database_url: str) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["read", "append"], name="ci")
    assert secret.startswith(f"lf_{token_id}_")
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT token_hash, scopes, tenant FROM ledgerflow.api_tokens WHERE id = %s", (token_id,)
        ).fetchone()
        dump = conn.execute("SELECT row_to_json(t)::text FROM ledgerflow.api_tokens t").fetchone()
    assert row == (hashlib.sha256(secret.encode()).hexdigest(), ["append", "read"], "acme")
    assert dump is not None
    assert secret.split("_", 2)[2] not in dump[0]

    principal = authenticate(services.store, secret)
    assert (principal.token_id, principal.tenant) == (token_id, "acme")
    assert principal.scopes == frozenset({"read", "append"})
    [info] = list_tokens(services.store)
    assert (info.id, info.name, info.tenant, info.scopes, info.active) == (
        token_id,
        "ci",
        "acme",
        ("append", "read"),
        True,
    )
    assert info.last_used_at is not None  # authenticate touched it


def test_revoked_tokens_stop_working_at_once(services: Services) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["admin"], name="ops")
    assert revoke_token(services.store, token_id) is True
    assert revoke_token(services.store, token_id) is False
    assert revoke_token(services.store, "0123456789abcdef") is False
    with pytest.raises(AuthenticationError, match="revoked"):
        authenticate(services.store, secret)
    assert not list_tokens(services.store)[0].active


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"tenant": "Bad Tenant", "scopes": ["read"], "name": "x"}, "tenant"),
        ({"tenant": "acme", "scopes": [], "name": "x"}, "scopes"),
        ({"tenant": "acme", "scopes": ["read", "root"], "name": "x"}, "scopes"),
        ({"tenant": "acme", "scopes": "read", "name": "x"}, "scopes"),
        ({"tenant": "acme", "scopes": ["read"], "name": "  "}, "name"),
    ],
)
def test_invalid_tokens_are_refused_before_anything_is_stored(
    services: Services, kwargs: dict[str, object], problem: str
) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        create_token(services.store, **kwargs)  # type: ignore[arg-type]
    assert list_tokens(services.store) == []


def test_admin_implies_every_scope_and_other_scopes_only_themselves(services: Services) -> None:
    _, secret = create_token(services.store, tenant="acme", scopes=["admin"], name="a")
    admin = authenticate(services.store, secret)
    assert all(admin.allows(s) for s in ("append", "read", "operate", "admin"))
    _, secret = create_token(services.store, tenant="acme", scopes=["read"], name="r")
    reader = authenticate(services.store, secret)
    assert reader.allows("read")
    assert not reader.allows("append")
    assert not reader.allows("admin")
    with pytest.raises(PermissionDeniedError) as caught:
        reader.require("append", "operate")
    assert caught.value.details() == {"required_any_of": ["append", "operate"], "granted": ["read"]}


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer not-a-token",
        "Bearer lf_0123456789abcdef_" + "x" * 43,  # well-formed, unknown id
    ],
)
def test_requests_without_a_live_token_get_401(
    client: TestClient, database_url: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    for method, path, body in [
        ("POST", "/api/v1/streams/order-1/events", events_body()),
        ("GET", "/api/v1/streams/order-1", None),
        ("GET", "/api/v1/runs", None),
        ("GET", "/api/v1/projections", None),
    ]:
        response = client.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["error"]["code"] == "unauthenticated"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert event_count(database_url) == 0


def test_a_wrong_secret_for_a_real_token_id_gets_401(
    client: TestClient, services: Services, database_url: str
) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["admin"], name="x")
    forged = f"lf_{token_id}_{'A' * 43}"
    assert forged != secret
    response = client.post(
        "/api/v1/streams/order-1/events", json=events_body(), headers={"Authorization": f"Bearer {forged}"}
    )
    assert response.status_code == 401
    assert event_count(database_url) == 0


def test_a_revoked_token_gets_401_over_http(client: TestClient, services: Services) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["admin"], name="x")
    headers = {"Authorization": f"Bearer {secret}"}
    assert client.get("/api/v1/workflows", headers=headers).status_code == 200
    revoke_token(services.store, token_id)
    # The API keeps a lookup for LEDGERFLOW_TOKEN_CACHE_SECONDS (test_tenant_fairness); past it, as here:
    client.app.state.tokens.forget()  # type: ignore[attr-defined]
    response = client.get("/api/v1/workflows", headers=headers)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


# (method, path, body) -> the scopes that may call it; admin may call everything.
RUN = "00000000-0000-0000-0000-000000000001"
MATRIX: list[tuple[str, str, object, set[str]]] = [
    ("POST", "/api/v1/streams/order-1/events", events_body(), {"append"}),
    ("GET", "/api/v1/streams/order-1", None, {"read"}),
    ("GET", "/api/v1/events", None, {"read"}),
    ("GET", "/api/v1/workflows", None, {"read"}),
    ("POST", "/api/v1/workflows/linear/runs", {"input": {"n": 1}}, {"append", "operate"}),
    ("GET", "/api/v1/runs", None, {"read"}),
    ("GET", f"/api/v1/runs/{RUN}", None, {"read"}),
    ("POST", f"/api/v1/runs/{RUN}/cancel", None, {"operate"}),
    ("POST", f"/api/v1/runs/{RUN}/retry", None, {"operate"}),
    ("POST", f"/api/v1/runs/{RUN}/refresh", {"input": None}, {"operate"}),
    ("GET", "/api/v1/projections", None, {"read"}),
    ("GET", "/api/v1/projections/stream_catalogue/runs", None, {"read"}),
    ("GET", "/api/v1/recovery", None, {"read"}),
    ("GET", "/api/v1/failures", None, set()),
    ("POST", "/api/v1/projections/stream_catalogue/replay", {"after": "0:0"}, set()),
    ("POST", "/api/v1/projections/stream_catalogue/rebuild", None, set()),
    ("POST", "/api/v1/projections/stream_catalogue/verify", None, set()),
    ("POST", "/api/v1/failures/1/retry", None, set()),
    ("POST", "/api/v1/failures/1/skip", None, set()),
]


@pytest.mark.parametrize("scope", ["append", "read", "operate"])
def test_each_scope_opens_exactly_its_routes(
    client: TestClient, make_token: MakeToken, database_url: str, scope: str
) -> None:
    headers: Headers = make_token(scope)
    for method, path, body, allowed in MATRIX:
        before = event_count(database_url)
        response = client.request(method, path, json=body, headers=headers)
        if scope in allowed:
            assert response.status_code not in (401, 403), (scope, path, response.text)
        else:
            assert response.status_code == 403, (scope, path, response.text)
            error = response.json()["error"]
            assert error["code"] == "forbidden"
            assert error["details"]["granted"] == [scope]
            assert event_count(database_url) == before, (scope, path)


def test_admin_opens_every_route(client: TestClient, admin: Headers) -> None:
    for method, path, body, _ in MATRIX:
        response = client.request(method, path, json=body, headers=admin)
        assert response.status_code not in (401, 403), (path, response.text)


def test_the_scope_is_checked_before_the_body(
    client: TestClient, make_token: MakeToken, database_url: str
) -> None:
    response = client.post(
        "/api/v1/streams/order-1/events", json={"events": "nonsense"}, headers=make_token("read")
    )
    assert response.status_code == 403
    response = client.post("/api/v1/streams/order-1/events", json={"events": "nonsense"})
    assert response.status_code == 401
    assert event_count(database_url) == 0


def test_a_token_name_shows_who_acted(client: TestClient, services: Services) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["append", "operate"], name="bot")
    headers = {"Authorization": f"Bearer {secret}"}
    run_id = client.post("/api/v1/workflows/linear/runs", json={}, headers=headers).json()["run_id"]
    client.post(f"/api/v1/runs/{run_id}/cancel", headers=headers)
    [requested] = [
        e
        for e in services.store.read_stream(f"wf-{uuid.UUID(run_id)}", tenant="acme")
        if e.type == "wf.RunCancelRequested"
    ]
    assert requested.data["actor"] == f"api:{token_id}"


def _token_row(database_url: str, token_id: str) -> tuple[Any, ...]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT role, expires_at - created_at, last_used_at FROM ledgerflow.api_tokens WHERE id = %s",
            (token_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_server_administrators_tokens_hold_admin(services: Services, database_url: str) -> None:
    token_id, secret = create_token(
        services.store, tenant="default", scopes=["admin"], name="ops", server_admin=True
    )
    principal = authenticate(services.store, secret)
    assert (principal.server_admin, principal.tenant) == (True, "default")
    assert _token_row(database_url, token_id)[0] == "server"
    assert not authenticate(
        services.store, create_token(services.store, tenant="default", scopes=["admin"], name="t")[1]
    ).server_admin
    with pytest.raises(InvalidInputError, match="admin scope"):
        create_token(services.store, tenant="default", scopes=["read"], name="x", server_admin=True)
    with pytest.raises(PermissionDeniedError) as refused:
        authenticate(
            services.store, create_token(services.store, tenant="a", scopes=["admin"], name="a")[1]
        ).require_server_admin("rebuilding 'workflow_tables'")
    assert refused.value.details() == {"required_any_of": ["server_admin"], "granted": ["admin"]}


def test_tokens_expire(client: TestClient, services: Services, database_url: str) -> None:
    token_id, secret = create_token(
        services.store, tenant="acme", scopes=["read"], name="short", expires_in=timedelta(days=30)
    )
    assert _token_row(database_url, token_id)[1] == timedelta(days=30)
    headers = {"Authorization": f"Bearer {secret}"}
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
    [info] = list_tokens(services.store)
    assert (info.status, info.active) == ("active", True)

    with psycopg.connect(database_url) as conn:  # thirty days later
        conn.execute(
            "UPDATE ledgerflow.api_tokens SET created_at = created_at - interval '31 days', "
            "expires_at = expires_at - interval '31 days', last_used_at = NULL WHERE id = %s",
            (token_id,),
        )
    client.app.state.tokens.forget()  # type: ignore[attr-defined]  # the lookup kept is from "then"
    response = client.get("/api/v1/runs", headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "unauthenticated"
    assert "expired" in error["message"]
    with pytest.raises(AuthenticationError, match="expired"):
        authenticate(services.store, secret)
    [info] = list_tokens(services.store)
    assert (info.status, info.active, info.last_used_at) == ("expired", False, None)  # not touched


@pytest.mark.parametrize("lifetime", [timedelta(0), timedelta(seconds=-1), timedelta(days=4000)])
def test_a_lifetime_out_of_range_is_refused(services: Services, lifetime: timedelta) -> None:
    with pytest.raises(InvalidInputError, match="lifetime"):
        create_token(services.store, tenant="acme", scopes=["read"], name="x", expires_in=lifetime)
    assert list_tokens(services.store) == []


def test_last_use_is_recorded_at_most_once_a_minute(
    client: TestClient, services: Services, database_url: str
) -> None:
    token_id, secret = create_token(services.store, tenant="acme", scopes=["read"], name="x")
    headers = {"Authorization": f"Bearer {secret}"}
    assert _token_row(database_url, token_id)[2] is None
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
    first = _token_row(database_url, token_id)[2]
    assert first is not None
    for _ in range(5):
        assert client.get("/api/v1/runs", headers=headers).status_code == 200
    assert _token_row(database_url, token_id)[2] == first  # not a write per request

    with psycopg.connect(database_url) as conn:  # a minute and a bit later
        conn.execute(
            "UPDATE ledgerflow.api_tokens SET last_used_at = last_used_at - interval '61 seconds' "
            "WHERE id = %s",
            (token_id,),
        )
    client.app.state.tokens.forget()  # type: ignore[attr-defined]  # the lookup kept is from "then"
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
    assert _token_row(database_url, token_id)[2] > first - timedelta(seconds=61)
    # A wrong secret for the same token id is refused and records nothing.
    before = _token_row(database_url, token_id)[2]
    forged = {"Authorization": f"Bearer lf_{token_id}_{'A' * 43}"}
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE ledgerflow.api_tokens SET last_used_at = last_used_at - interval '61 seconds' "
            "WHERE id = %s",
            (token_id,),
        )
    assert client.get("/api/v1/runs", headers=forged).status_code == 401
    assert _token_row(database_url, token_id)[2] == before - timedelta(seconds=61)


def test_the_cli_creates_and_lists_tokens_readably(database_url: str) -> None:
    from click.testing import CliRunner

    from ops.cli.commands import cli

    runner = CliRunner()
    env = {"LEDGERFLOW_DATABASE_URL": database_url}
    created = runner.invoke(
        cli, ["tokens", "create", "--server-admin", "--expires-in", "30d", "--name", "ops"], env=env
    )
    assert created.exit_code == 0, created.output
    assert "server administrator" in created.output
    secret = created.output.strip().splitlines()[-1]
    assert secret.startswith("lf_")
    tenant = runner.invoke(cli, ["tokens", "create", "--tenant", "acme", "--scope", "read"], env=env)
    assert tenant.exit_code == 0, tenant.output
    bad = runner.invoke(cli, ["tokens", "create", "--expires-in", "soon"], env=env)
    assert bad.exit_code != 0
    assert "duration" in bad.output

    listed = runner.invoke(cli, ["tokens", "list"], env={**env, "COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    for text in ("server admin", "tenant", "acme", "active", "admin", "read"):
        assert text in listed.output, text
    for python in ("datetime.", "TokenInfo(", "('", "None"):  # no Python reprs
        assert python not in listed.output, python

    as_json = runner.invoke(cli, ["tokens", "list", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)
    assert [(r["role"], r["scopes"], r["status"]) for r in rows] == [
        ("server", ["admin"], "active"),
        ("tenant", ["read"], "active"),
    ]
    assert rows[0]["expires_at"] is not None
    assert rows[1]["expires_at"] is None


def test_serve_makes_a_server_administrators_token_until_one_exists(
    services: Services, capsys: pytest.CaptureFixture[str]
) -> None:
    from ops.serve import _bootstrap_token

    create_token(services.store, tenant="default", scopes=["admin"], name="from before roles")
    _bootstrap_token(services)
    [secret] = re.findall(r"lf_[0-9a-f]{16}_\S+", capsys.readouterr().out)
    assert authenticate(services.store, secret).server_admin
    _bootstrap_token(services)  # one exists now: nothing more is made or shown
    assert "lf_" not in capsys.readouterr().out
    assert [t.role for t in list_tokens(services.store)] == ["tenant", "server"]

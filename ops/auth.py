"""API tokens: creating, listing and revoking them, and authenticating a bearer secret.

A token belongs to one tenant and carries scopes: `append` (append events, start runs), `read` (read
events, runs and projection health), `operate` (start, cancel, retry and refresh runs) and `admin` (every
scope, plus operator actions on projections and failures). The secret, `lf_<id>_<random>`, is shown
once; only its SHA-256 is stored. The public `<id>` part finds the row, the hash proves the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import structlog

from eventstore import EventStore, InvalidInputError, LedgerflowError
from eventstore._validation import check_tenant
from eventstore.db import translate_errors
from eventstore.sqlfile import load_queries

__all__ = [
    "SCOPES",
    "AuthenticationError",
    "PermissionDeniedError",
    "Principal",
    "TokenInfo",
    "authenticate",
    "create_token",
    "list_tokens",
    "revoke_token",
]

log = structlog.get_logger(__name__)
# Loaded by path from inside `ops`, so that the CLI's token commands do not import the web framework.
Q = load_queries("ops", "api/tokens.sql")

SCOPES: Final = ("append", "read", "operate", "admin")
ADMIN: Final = "admin"
_SECRET = re.compile(r"lf_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})")
_MAX_NAME = 200


class AuthenticationError(LedgerflowError, PermissionError):
    """No bearer secret, or one that is not a live token's; nothing was done."""

    code = "unauthenticated"


class PermissionDeniedError(LedgerflowError, PermissionError):
    """The token is valid but lacks the scope the request needs; nothing was done."""

    code = "forbidden"

    def __init__(self, message: str, *, required: Sequence[str], granted: Sequence[str]) -> None:
        super().__init__(message)
        self.required = tuple(required)
        self.granted = tuple(granted)

    def details(self) -> dict[str, Any]:
        return {"required_any_of": list(self.required), "granted": list(self.granted)}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: a token, its tenant and its scopes."""

    token_id: str
    tenant: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    def require(self, *any_of: str) -> None:
        """Raise PermissionDeniedError unless the token has one of `any_of` (or admin)."""
        if not any(self.allows(s) for s in any_of):
            raise PermissionDeniedError(
                f"this token lacks the scope for the request: it needs {' or '.join(any_of)}, "
                f"and has {', '.join(sorted(self.scopes))}",
                required=any_of,
                granted=sorted(self.scopes),
            )


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    name: str
    tenant: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _check_scopes(scopes: Sequence[str]) -> list[str]:
    if isinstance(scopes, str):
        raise InvalidInputError(f"scopes must be a list of scope names, not the string {scopes!r}")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidInputError(
            f"scopes {list(scopes)!r} are invalid: name one or more of {', '.join(SCOPES)}"
        )
    return [s for s in SCOPES if s in scopes]


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > _MAX_NAME or not name.isprintable():
        raise InvalidInputError(
            f"token name {name!r} is invalid: use 1-{_MAX_NAME} printable characters, e.g. 'ci-deployer'"
        )
    return name.strip()


def create_token(store: EventStore, *, tenant: str, scopes: Sequence[str], name: str) -> tuple[str, str]:
    """Create a token; return (token id, secret). The secret is shown this once and never stored."""
    check_tenant(tenant)
    ordered = _check_scopes(scopes)
    name = _check_name(name)
    token_id = secrets.token_hex(8)
    secret = f"lf_{token_id}_{secrets.token_urlsafe(32)}"
    params = {
        "id": token_id,
        "name": name,
        "tenant": tenant,
        "scopes": ordered,
        "token_hash": hash_secret(secret),
    }
    with translate_errors(), store.pool.connection() as conn:
        conn.execute(Q["insert_token"], params)
    log.info("api_token_created", token_id=token_id, tenant=tenant, scopes=ordered, name=name)
    return token_id, secret


def revoke_token(store: EventStore, token_id: str) -> bool:
    """Revoke a token; True if it was live, False if it is unknown or was already revoked."""
    with translate_errors(), store.pool.connection() as conn:
        revoked = conn.execute(Q["revoke_token"], {"id": token_id}).fetchone() is not None
    if revoked:
        log.info("api_token_revoked", token_id=token_id)
    return revoked


def list_tokens(store: EventStore) -> list[TokenInfo]:
    """Every token, live and revoked, oldest first (never their secrets, which are not kept)."""
    with translate_errors(), store.pool.connection() as conn:
        rows = conn.execute(Q["list_tokens"]).fetchall()
    return [TokenInfo(r[0], r[1], r[2], tuple(r[3]), r[4], r[5], r[6]) for r in rows]


def authenticate(store: EventStore, secret: str) -> Principal:
    """The principal a bearer secret stands for; AuthenticationError if it is not a live token's."""
    match = _SECRET.fullmatch(secret) if isinstance(secret, str) else None
    if match is None:
        raise AuthenticationError("the bearer token is malformed: API tokens look like 'lf_<id>_<secret>'")
    token_hash = hash_secret(secret)
    with translate_errors(), store.pool.connection() as conn:
        row = conn.execute(Q["authenticate"], {"id": match[1], "token_hash": token_hash}).fetchone()
    # compare_digest: the answer takes as long whichever character of the hash differs.
    if row is None or not hmac.compare_digest(str(row[2]), token_hash):
        raise AuthenticationError("the bearer token is not valid")
    tenant, scopes, _, revoked = row
    if revoked:
        raise AuthenticationError("the bearer token was revoked")
    return Principal(match[1], str(tenant), frozenset(scopes))

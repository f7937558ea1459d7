"""API tokens: creating, listing and revoking them, and authenticating a bearer secret.

A token belongs to one tenant and carries scopes: `append` (append events, start runs), `read` (read
events, runs and projection health), `operate` (start, cancel, retry and refresh runs) and `admin` (every
scope, plus operator actions on its tenant's failures and on per-tenant projections).

A token's role is `tenant` (everything above, on its own tenant's data only) or `server` (a server
administrator: an admin of its own tenant that may also rebuild, replay and verify the projections every
tenant reads, see every tenant's failures and read `/metrics`).

The secret, `lf_<id>_<random>`, is shown once; only its SHA-256 is stored. The public `<id>` part finds
the row, the hash proves the secret. A token may expire; it records when it was last used (to the minute).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import structlog

from eventstore import EventStore, InvalidInputError, LedgerflowError, check_tenant
from eventstore.spi import Connection, class_row, kwargs_row, load_queries

__all__ = [
    "SCOPES",
    "SERVER_ADMIN",
    "AuthenticationError",
    "PermissionDeniedError",
    "Principal",
    "TokenInfo",
    "authenticate",
    "check_secret_format",
    "create_token",
    "has_server_admin_token",
    "hash_secret",
    "list_tokens",
    "look_up_token",
    "revoke_token",
]

log = structlog.get_logger(__name__)
# Loaded by path from inside `ops`, so that the CLI's token commands do not import the web framework.
Q = load_queries("ops", "api/tokens.sql")

SCOPES: Final = ("append", "read", "operate", "admin")
ADMIN: Final = "admin"
#: What a request that only a server administrator may make requires, as named in errors and OpenAPI.
SERVER_ADMIN: Final = "server_admin"
Role = Literal["tenant", "server"]
_SECRET = re.compile(r"lf_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})")
_MAX_NAME = 200
#: The longest lifetime `--expires-in` accepts (ten years); longer means "never", which is the default.
MAX_LIFETIME: Final = timedelta(days=3650)


class AuthenticationError(LedgerflowError, PermissionError):
    """No bearer secret, or one that is not a live token's; nothing was done."""

    code = "unauthenticated"


class PermissionDeniedError(LedgerflowError, PermissionError):
    """The token is valid but lacks the scope or role the request needs; nothing was done."""

    code = "forbidden"

    def __init__(self, message: str, *, required: Sequence[str], granted: Sequence[str]) -> None:
        super().__init__(message)
        self.required = tuple(required)
        self.granted = tuple(granted)

    def details(self) -> dict[str, Any]:
        return {"required_any_of": list(self.required), "granted": list(self.granted)}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: a token, its tenant, its scopes and whether it is a server administrator's."""

    token_id: str
    tenant: str
    scopes: frozenset[str]
    server_admin: bool = False

    @property
    def granted(self) -> list[str]:
        """The scopes, and `server_admin` for a server administrator, as errors show them."""
        return sorted(self.scopes) + ([SERVER_ADMIN] if self.server_admin else [])

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    def require(self, *any_of: str) -> None:
        """Raise PermissionDeniedError unless the token has one of `any_of` (or admin)."""
        if not any(self.allows(s) for s in any_of):
            raise PermissionDeniedError(
                f"this token lacks the scope for the request: it needs {' or '.join(any_of)}, "
                f"and has {', '.join(sorted(self.scopes))}",
                required=any_of,
                granted=self.granted,
            )

    def require_server_admin(self, what: str) -> None:
        """Raise PermissionDeniedError unless this is a server administrator's token; `what` says what was
        refused, e.g. "rebuilding 'workflow_tables', which every tenant reads,"."""
        if not self.server_admin:
            raise PermissionDeniedError(
                f"{what} needs a server administrator's token (`ledgerflow tokens create --server-admin`); "
                f"this token is tenant {self.tenant!r}'s; nothing was done",
                required=[SERVER_ADMIN],
                granted=self.granted,
            )


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    name: str
    tenant: str
    scopes: tuple[str, ...]
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of_row(cls, *, scopes: Sequence[str], **columns: Any) -> TokenInfo:
        return cls(scopes=tuple(scopes), **columns)

    @property
    def server_admin(self) -> bool:
        return self.role == "server"

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= datetime.now(UTC)

    @property
    def active(self) -> bool:
        return self.revoked_at is None and not self.expired

    @property
    def status(self) -> Literal["active", "revoked", "expired"]:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expired else "active"


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


def _check_lifetime(expires_in: timedelta | None) -> float | None:
    if expires_in is None:
        return None
    if not isinstance(expires_in, timedelta) or not timedelta(0) < expires_in <= MAX_LIFETIME:
        raise InvalidInputError(
            f"a token's lifetime must be more than 0 and at most {MAX_LIFETIME.days} days, "
            f"not {expires_in}; leave it out for a token that never expires"
        )
    return expires_in.total_seconds()


def create_token(
    store: EventStore,
    *,
    tenant: str,
    scopes: Sequence[str],
    name: str,
    server_admin: bool = False,
    expires_in: timedelta | None = None,
) -> tuple[str, str]:
    """Create a token; return (token id, secret). The secret is shown this once and never stored.

    A server administrator's token (`server_admin`) holds `admin`; `expires_in` limits its lifetime."""
    check_tenant(tenant)
    ordered = _check_scopes(scopes)
    name = _check_name(name)
    lifetime = _check_lifetime(expires_in)
    if server_admin and ADMIN not in ordered:
        raise InvalidInputError(
            f"a server administrator's token holds the admin scope; scopes {ordered!r} lack it"
        )
    token_id = secrets.token_hex(8)
    secret = f"lf_{token_id}_{secrets.token_urlsafe(32)}"
    params = {
        "id": token_id,
        "name": name,
        "tenant": tenant,
        "scopes": ordered,
        "role": "server" if server_admin else "tenant",
        "lifetime_seconds": lifetime,
        "token_hash": hash_secret(secret),
    }
    with store.connection() as conn:
        conn.execute(Q["insert_token"], params)
    log.info(
        "api_token_created",
        token_id=token_id,
        tenant=tenant,
        scopes=ordered,
        name=name,
        role=params["role"],
        expires_in_seconds=lifetime,
    )
    return token_id, secret


def revoke_token(store: EventStore, token_id: str) -> bool:
    """Revoke a token; True if it was live, False if it is unknown or was already revoked."""
    with store.connection() as conn:
        revoked = conn.execute(Q["revoke_token"], {"id": token_id}).fetchone() is not None
    if revoked:
        log.info("api_token_revoked", token_id=token_id)
    return revoked


def list_tokens(store: EventStore) -> list[TokenInfo]:
    """Every token, live, expired and revoked, oldest first (never their secrets, which are not kept)."""
    with (
        store.connection() as conn,
        conn.cursor(row_factory=kwargs_row(TokenInfo.of_row)) as cur,
    ):
        return cur.execute(Q["list_tokens"]).fetchall()


def has_server_admin_token(store: EventStore) -> bool:
    """Whether a server administrator's token was ever created (live, expired or revoked)."""
    with store.connection() as conn:
        return conn.execute(Q["has_server_admin_token"]).fetchone() is not None


def check_secret_format(secret: str) -> re.Match[str]:
    """The secret's parts; AuthenticationError if it cannot be a token's. Costs no database round trip,
    so a server can refuse a malformed bearer before it reads anything else of a request."""
    match = _SECRET.fullmatch(secret) if isinstance(secret, str) else None
    if match is None:
        raise AuthenticationError("the bearer token is malformed: API tokens look like 'lf_<id>_<secret>'")
    return match


def authenticate(store: EventStore, secret: str) -> Principal:
    """The principal a bearer secret stands for; AuthenticationError if it is not a live token's."""
    check_secret_format(secret)
    with store.connection() as conn:
        return look_up_token(conn, secret)[0]


def look_up_token(conn: Connection, secret: str) -> tuple[Principal, datetime | None]:
    """The principal a bearer secret stands for and when its token expires (None: never), looked up on
    `conn`; AuthenticationError if it is not a live token's. For callers that keep a connection of their
    own for lookups (`ops.api.token_lookups`), whose connection translates driver errors
    (`eventstore.spi.OwnConnection`), as `store.connection()` does."""
    match = check_secret_format(secret)
    token_hash = hash_secret(secret)
    with conn.cursor(row_factory=class_row(_TokenRow)) as cur:
        row = cur.execute(Q["authenticate"], {"id": match[1], "token_hash": token_hash}).fetchone()
    # compare_digest: the answer takes as long whichever character of the hash differs.
    if row is None or not hmac.compare_digest(row.token_hash, token_hash):
        raise AuthenticationError("the bearer token is not valid")
    if row.revoked:
        raise AuthenticationError("the bearer token was revoked")
    if row.expired:
        assert row.expires_at is not None  # only a token with an expiry expires
        raise AuthenticationError(
            f"the bearer token expired at {row.expires_at.isoformat(timespec='seconds')}; "
            "create a new one with `ledgerflow tokens create`"
        )
    principal = Principal(match[1], row.tenant, frozenset(row.scopes), server_admin=row.role == "server")
    return principal, row.expires_at


@dataclass(frozen=True, slots=True)
class _TokenRow:
    """A row of authenticate: the token's tenant, scopes, hash, role and expiry, and whether it was
    revoked or has expired."""

    tenant: str
    scopes: list[str]
    token_hash: str
    revoked: bool
    role: str
    expires_at: datetime | None
    expired: bool

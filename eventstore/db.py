"""Connections: resolving the database, the connection pool, and translating driver errors once.

Driver exceptions never leave ledgerflow untranslated: `wrap_exceptions()` turns them into the
`LedgerflowError` tree, keeping the original as `__cause__`. Packages above pass the translations of their
own SQLSTATEs; unique violations map to domain errors by constraint name.
"""

from __future__ import annotations

import json
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg.errors
import psycopg.types.json
import psycopg_pool
import structlog

from eventstore import jsonvalue
from eventstore.errors import (
    DatabaseUnavailableError,
    DuplicateEventIdError,
    IdempotencyConflictError,
    InvalidInputError,
    LedgerflowError,
    MissingRelationError,
    WrongExpectedVersionError,
)
from eventstore.pooling import Pool
from eventstore.refusals import connection_failed

if TYPE_CHECKING:
    # Only named here: a program that never reads settings from the environment does not load
    # pydantic-settings.
    from eventstore.settings import DatabaseSettings

log = structlog.get_logger(__name__)

# SQLSTATEs raised on purpose by ledgerflow's own SQL (see migrations/).
WRONG_EXPECTED_VERSION = "LF001"
IDEMPOTENCY_CONFLICT = "LF002"
APPEND_ONLY = "LF003"


#: How long the pool tries to replace a lost connection before it gives up, until a caller asks for one
#: again (which starts a new attempt at once). Its back-off doubles from 1 s, so with psycopg_pool's
#: default (300 s) a failover of 10 s was noticed at its attempt after 15 s; this bounds the wait.
RECONNECT_TIMEOUT = 3.0

#: A connection, as the packages above name it in annotations (through `eventstore.spi`).
Connection = psycopg.Connection[Any]

#: The pipeline each connection in `pipelined` runs, for `synced`.
_pipelines: weakref.WeakKeyDictionary[psycopg.Connection[Any], psycopg.Pipeline] = weakref.WeakKeyDictionary()

_Row = TypeVar("_Row")


@contextmanager
def pipelined(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Pipeline]:
    """`conn.pipeline()`, known to `synced`: statements travel together; fetch answers with `synced`."""
    with conn.pipeline() as pipeline:
        _pipelines[conn] = pipeline
        try:
            yield pipeline
        finally:
            _pipelines.pop(conn, None)


def synced(cursor: psycopg.Cursor[_Row]) -> psycopg.Cursor[_Row]:
    """`cursor`, its answer in. In a `pipelined` block, when the answer has not come yet, a Sync goes out
    with the statements sent so far, so that the server has finished them and, inside a transaction, waits
    "idle in transaction" while the client works on the answer, which idle_in_transaction_session_timeout
    bounds. Fetched as psycopg does, with a flush request, the server would wait mid-pipeline as "active"
    (and a flush also disarms the idle timer): a client frozen there (SIGSTOP, a long pause) would hold the
    transaction's row locks past its lease with nothing to end them. No extra round trip: the Sync travels
    with the statements."""
    pipeline = _pipelines.get(cursor.connection)
    if pipeline is not None and cursor.pgresult is None:
        pipeline.sync()
    return cursor


def resolve_database_url(settings: DatabaseSettings) -> str:
    """The configured URL, or the URL of the embedded PostgreSQL, started if need be."""
    if settings.database_url:
        return settings.database_url
    from eventstore.embedded import start_embedded

    return start_embedded(settings.embedded_data_dir)


#: libpq's TCP settings, for every parameter the database URL does not set itself. Without them a
#: partition (packets vanish: no reset, no FIN) leaves a connection hanging for as long as the kernel
#: retransmits (about 15 minutes with Linux's tcp_retries2=15) or, when nothing is in flight (a LISTEN, a
#: statement waiting for its answer), for ever; and after the network heals the retransmissions' own
#: back-off (up to 2 minutes between tries) keeps it silent for about as long again as the partition
#: lasted. With them a process notices within about 10 s, the default lease of workflow and projector
#: workers (a worker that cannot reach the database for a lease has lost its leases anyway), reports
#: the outage, and connects afresh: once the network heals it is back within the outage back-off.
#:   * tcp_user_timeout: sent data unacknowledged for 10 s ends the connection. The peer's kernel
#:     acknowledges whatever its process is doing, so a busy server, a long statement or a paused
#:     process never trip it; only a network that carries nothing does.
#:   * keepalives: a connection silent for 5 s is probed every 2 s; with tcp_user_timeout set, Linux
#:     ends it once probes have gone unanswered past those 10 s (count 3: the same 11 s where
#:     tcp_user_timeout is not supported).
#:   * connect_timeout: a connection attempt to a host that does not answer gives up after 5 s and is
#:     tried again (SYNs are otherwise retried for about 2 minutes, ever further apart).
#: Ignored on Unix-domain sockets (the embedded server).
NETWORK_TIMEOUTS: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
    "connect_timeout": "5",
}


#: The same on the server's side of each connection of ledgerflow's (PostgreSQL takes them per session).
#: Without them the server keeps a vanished client's session for as long as its own TCP settings say,
#: two hours by default, and with it whatever the session holds: a writer's transaction-level lock
#: holds back every reader's horizon, a worker's presence lock keeps it looking alive. With them the
#: server ends such a session within about 10 s, and rolls back its transaction. A paused or busy client
#: is not ended: its kernel acknowledges for it. Set with SET, not the `options` startup parameter, which
#: a pooler such as PgBouncer refuses unless told to ignore it; a URL's own `options` are left alone, and
#: a setting they give wins.
SERVER_NETWORK_TIMEOUTS: dict[str, str] = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
_SET_SERVER_TIMEOUTS = (
    "SELECT set_config(s.name, s.value, false) FROM unnest(%s::text[], %s::text[]) AS s(name, value)"
)


def _url_options(url: str) -> str:
    """The `options` startup parameter `url` gives ("-c name=value ..."), or ""."""
    return str(psycopg.conninfo.conninfo_to_dict(url).get("options") or "")


def set_server_network_timeouts(conn: psycopg.Connection[Any], url: str) -> None:
    """Set `SERVER_NETWORK_TIMEOUTS` for `conn`'s session, except those `url`'s options set."""
    given = _url_options(url)
    wanted = {k: v for k, v in SERVER_NETWORK_TIMEOUTS.items() if k not in given}
    if wanted:
        conn.execute(_SET_SERVER_TIMEOUTS, (list(wanted), list(wanted.values())), prepare=False)
        if not conn.autocommit:
            conn.commit()


def with_network_timeouts(url: str) -> str:
    """`url` with `NETWORK_TIMEOUTS` for the parameters it does not set (a URL stays a URL)."""
    missing = {k: v for k, v in NETWORK_TIMEOUTS.items() if k not in psycopg.conninfo.conninfo_to_dict(url)}
    if not missing:
        return url
    if url.startswith(("postgresql://", "postgres://")):
        return url + ("&" if "?" in url else "?") + urllib.parse.urlencode(missing)
    return psycopg.conninfo.make_conninfo(url, **missing)


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A connection of its own (a listener, a presence, a probe) with the network timeouts the pool's
    connections have, so that a partition ends it too instead of leaving it hanging."""
    conn = psycopg.connect(with_network_timeouts(url), **kwargs)
    try:
        set_server_network_timeouts(conn, url)
    except BaseException:
        conn.close()
        raise
    return conn


def open_pool(
    url: str, settings: DatabaseSettings, *, name: str = "ledgerflow"
) -> psycopg_pool.ConnectionPool[Any]:
    """An open pool of autocommit connections; fails with a clear error if the database does not answer."""
    idle_ms = int(settings.idle_in_transaction_timeout * 1000)
    pool = Pool(
        with_network_timeouts(url),
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        max_idle=settings.pool_max_idle,
        kwargs={
            "autocommit": True,
            "application_name": name,
            # The URL's own options are kept, after this one: a setting they give wins.
            "options": f"-c idle_in_transaction_session_timeout={idle_ms} {_url_options(url)}".strip(),
        },
        name=name,
        reconnect_timeout=RECONNECT_TIMEOUT,
        configure=lambda conn: _configure(conn, url),
        check=discard_if_turned_read_only,
        open=False,
    )
    try:
        pool.open(wait=True, timeout=settings.connect_timeout)
    except psycopg_pool.PoolTimeout as exc:
        pool.close()
        raise DatabaseUnavailableError(
            f"could not connect to PostgreSQL at {redact(url)} within {settings.connect_timeout:g}s; "
            "check that the server runs and LEDGERFLOW_DATABASE_URL is right"
        ) from exc
    return pool


#: Whether each pooled connection's server was read-only when it connected (see `turned_read_only`).
_read_only_at_connect: weakref.WeakKeyDictionary[psycopg.Connection[Any], bool] = weakref.WeakKeyDictionary()


def _configure(conn: psycopg.Connection[Any], url: str) -> None:
    use_exact_json(conn)
    set_server_network_timeouts(conn, url)
    _read_only_at_connect[conn] = _read_only(conn)


def _read_only(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server refuses writes on `conn`, as it last reported: PostgreSQL 14+ sends both
    settings to the client whenever they change (ParameterStatus), so this costs no round trip. Asked of
    libpq directly: through `conn.info` (which decodes names and values in the connection's encoding, looked
    up each time) it cost 3.7 us, at every append on a pinned connection (`eventstore.pinning`), against
    0.4 us."""
    pgconn = conn.pgconn
    return b"on" in (
        pgconn.parameter_status(b"in_hot_standby"),
        pgconn.parameter_status(b"default_transaction_read_only"),
    )


def turned_read_only(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn`'s server has refused writes since the connection opened: a primary being demoted
    by a failover (pg_auto_failover first sets default_transaction_read_only, then restarts it as a
    standby). Such a connection must be replaced, so that the URL's `target_session_attrs=read-write`
    finds the new primary; a server that was read-only from the start is left alone."""
    return _read_only(conn) and not _read_only_at_connect.get(conn, False)


def discard_if_turned_read_only(conn: psycopg.Connection[Any]) -> None:
    """The pool's check at every checkout: closes a connection whose server turned read-only, which
    makes the pool discard it and hand out (or open) another."""
    if turned_read_only(conn):
        conn.close()
        raise DatabaseUnavailableError("the server turned read-only (a failover demoted it); reconnecting")


def use_exact_json(conn: psycopg.Connection[Any]) -> None:
    """json and jsonb values read and written on `conn` keep every number's exact value (see
    `eventstore.jsonvalue`)."""
    psycopg.types.json.set_json_loads(jsonvalue.loads, conn)
    psycopg.types.json.set_json_dumps(jsonvalue.dumps, conn)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **info)


def _detail(exc: psycopg.Error) -> dict[str, Any]:
    raw = exc.diag.message_detail or "{}"
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _wrong_expected_version(exc: psycopg.Error) -> LedgerflowError:
    d = _detail(exc)
    expected = int(d.get("expected", 0))
    shown = {-1: "any", -2: "no stream", -3: "stream exists"}.get(expected, f"version {expected}")
    return WrongExpectedVersionError(str(d.get("tenant")), str(d.get("stream_id")), shown, d.get("actual"))


def _idempotency_conflict(exc: psycopg.Error) -> LedgerflowError:
    d = _detail(exc)
    return IdempotencyConflictError(str(d.get("tenant")), str(d.get("key")))


def _append_only(exc: psycopg.Error) -> LedgerflowError:
    return InvalidInputError(f"{exc.diag.message_primary}; {exc.diag.message_hint or ''}".rstrip("; "))


#: A translation of one driver error into the error (or signal) that callers catch.
Translation = Callable[[psycopg.Error], BaseException]

#: The event log's own SQLSTATEs (raised on purpose by its SQL) and what they mean.
SQLSTATES: dict[str, Callable[[psycopg.Error], LedgerflowError]] = {
    WRONG_EXPECTED_VERSION: _wrong_expected_version,
    IDEMPOTENCY_CONFLICT: _idempotency_conflict,
    APPEND_ONLY: _append_only,
}

#: Unique and exclusion constraints whose violation is a domain error, by constraint name.
CONSTRAINTS: dict[str, Callable[[psycopg.Error], LedgerflowError]] = {
    "events_tenant_event_id_unique": lambda exc: DuplicateEventIdError(
        exc.diag.message_detail or "an event id is already in this tenant's log"
    ),
}


def _refused(exc: psycopg.Error) -> str:
    """What the database (or the driver, before sending) refused, in words."""
    primary = exc.diag.message_primary
    if primary is None:
        # Raised by the driver itself, e.g. a NUL character in a text parameter.
        text = str(exc)
        if "NUL" in text:
            return "a text value contains a NUL character (\\x00 or \\u0000), which PostgreSQL cannot store"
        return text or type(exc).__name__
    column = exc.diag.column_name
    constraint = exc.diag.constraint_name
    where = f" (column {column})" if column else f" (constraint {constraint})" if constraint else ""
    return f"{primary}{where}"


def translate(exc: psycopg.Error) -> LedgerflowError:
    """The ledgerflow error for a driver error."""
    state = exc.sqlstate
    own = SQLSTATES.get(state or "")
    if own is not None:
        return own(exc)
    if isinstance(exc, psycopg.errors.UniqueViolation | psycopg.errors.ExclusionViolation):
        by_name = CONSTRAINTS.get(exc.diag.constraint_name or "")
        if by_name is not None:
            return by_name(exc)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return MissingRelationError(f"a table is missing: {exc.diag.message_primary}")
    if isinstance(
        exc,
        psycopg.DataError
        | psycopg.errors.IntegrityConstraintViolation
        | psycopg.errors.CharacterNotInRepertoire
        | psycopg.errors.UntranslatableCharacter,
    ):
        return InvalidInputError(f"the database refused the input: {_refused(exc)}")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return DatabaseUnavailableError(f"no database connection became free in time: {exc}")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        # 25006: the server refuses writes; after a failover, a demoted primary does so until it
        # restarts as a standby. Its connections are replaced (`turned_read_only`) and the write is
        # tried again on the new primary, as after any outage.
        return DatabaseUnavailableError(
            f"the database is read-only (a failover in progress?): {exc}; retry once the primary answers"
        )
    if isinstance(exc, psycopg.OperationalError):
        return connection_failed(exc)
    return LedgerflowError(f"unexpected database error ({state}): {exc}")


@contextmanager
def wrap_exceptions(
    extra: Mapping[str, Translation] | None = None,
    *,
    constraints: Mapping[str, Translation] | None = None,
) -> Iterator[None]:
    """Driver errors raised inside become ledgerflow errors (`__cause__` is the driver's error).

    The one boundary between psycopg and the rest of ledgerflow. A package whose SQL raises SQLSTATEs of
    its own passes their translations as `extra`, and those of its unique or exclusion constraints, by
    constraint name, as `constraints`.
    """
    try:
        yield
    except psycopg.Error as exc:
        own = extra.get(exc.sqlstate or "") if extra else None
        unique = isinstance(exc, psycopg.errors.UniqueViolation | psycopg.errors.ExclusionViolation)
        if own is None and constraints and unique:
            own = constraints.get(exc.diag.constraint_name or "")
        raise (own(exc) if own is not None else translate(exc)) from exc

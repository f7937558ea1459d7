"""Token lookups of the API: kept for a few seconds, and made on a connection of their own.

Every request under `/api/v1` names a token. Looking it up on every request would cost each request a
round trip, a thread and a pool connection before it does anything, and a tenant sending many requests (or
anyone sending many with a bogus token) would make every other tenant's requests queue behind those
lookups. So:

* what a lookup found is kept for `ttl` seconds (LEDGERFLOW_TOKEN_CACHE_SECONDS): a live token's principal
  (never past the token's expiry), and a refusal of a bogus, revoked or expired one. A token revoked
  meanwhile stops working within `ttl`. Both maps are bounded (LEDGERFLOW_TOKEN_CACHE_SIZE, least recently
  used dropped first), refusals apart, so bogus tokens cannot push live ones out;
* concurrent requests with the same secret share one lookup;
* lookups run one at a time on a thread and a database connection of their own (application name
  `ledgerflow-api-auth`): never behind the requests' thread pool or connection pool.

Keys are the secrets' SHA-256, as stored: the secrets themselves are not kept.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Generic, TypeVar

import structlog

from eventstore import DatabaseUnavailableError, EventStore
from eventstore.spi import OwnConnection
from ops.auth import AuthenticationError, Principal, check_secret_format, hash_secret, look_up_token

log = structlog.get_logger(__name__)

_CONNECT_TIMEOUT = 5
V = TypeVar("V")


class _Bounded(Generic[V]):
    """A map of at most `size` entries that expire, the least recently used dropped first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str, now: float) -> V | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return found[1]

    def put(self, key: str, until: float, value: V) -> None:
        self._entries[key] = (until, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


class TokenLookups:
    """Authenticates bearer secrets for one API (see the module). `authenticate` runs on its event loop."""

    def __init__(
        self, store: EventStore, *, ttl: float, size: int, name: str = "ledgerflow-api-auth"
    ) -> None:
        self._store, self._ttl = store, ttl
        self._live: _Bounded[Principal] = _Bounded(size)
        self._refused: _Bounded[AuthenticationError] = _Bounded(size)
        self._pending: dict[str, asyncio.Future[tuple[Principal, datetime | None]]] = {}
        self._thread_name = name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._executor_stopped = False
        # Only ever used on the executor's thread.
        self._conn = OwnConnection(store.url, name=name, connect_timeout=_CONNECT_TIMEOUT)
        # Until `start` (the app's lifespan, which also stops it), a lookup's connection is not kept.
        self._keep = False

    def start(self) -> None:
        if self._executor_stopped:  # the app's lifespan runs again (a test client per test)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
            self._executor_stopped = False
        self._keep = True

    async def authenticate(self, secret: str) -> Principal:
        """The principal `secret` stands for; AuthenticationError if it is not a live token's (at once
        for what cannot be a token), DatabaseUnavailableError if the lookup failed."""
        check_secret_format(secret)  # no round trip for what cannot be a token
        key = hash_secret(secret)
        now = time.monotonic()
        if (principal := self._live.get(key, now)) is not None:
            return principal
        if (refusal := self._refused.get(key, now)) is not None:
            raise AuthenticationError(str(refusal))
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().run_in_executor(self._executor, self._look_up, secret)
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._settle(key, done))
        # shield: a request that goes away does not cancel the lookup others share.
        found, _ = await asyncio.shield(pending)
        return found

    def forget(self) -> None:
        """Drops everything kept: the next request with any token looks it up."""
        self._live.clear()
        self._refused.clear()

    def _settle(self, key: str, done: asyncio.Future[tuple[Principal, datetime | None]]) -> None:
        self._pending.pop(key, None)
        if done.cancelled() or self._ttl <= 0:
            return
        until = time.monotonic() + self._ttl
        error = done.exception()
        if isinstance(error, AuthenticationError):
            self._refused.put(key, until, error)
        elif error is None:
            principal, expires_at = done.result()
            if expires_at is not None:  # never kept past the token's expiry
                until = min(until, time.monotonic() + (expires_at - datetime.now(UTC)).total_seconds())
            self._live.put(key, until, principal)

    def _look_up(self, secret: str) -> tuple[Principal, datetime | None]:
        if self._store.pool.closed:  # the server is stopping (or its database was closed): as every request
            raise DatabaseUnavailableError("the server's database connections are closed")
        # One retry on a fresh connection: the kept one may have been ended (a restart, a partition).
        # A failed use closes it (OwnConnection), so the retry opens another.
        for attempt in (1, 2):
            try:
                with self._conn.use() as conn:
                    return look_up_token(conn, secret)
            except DatabaseUnavailableError as exc:
                if attempt == 2:
                    log.warning("api_token_lookup_failed", error=str(exc))
                    raise
            finally:
                if not self._keep:
                    self._close()
        raise AssertionError("unreachable")

    def _close(self) -> None:
        self._conn.close()

    async def stop(self) -> None:
        if self._executor_stopped:
            return
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor_stopped = True

"""Requests in flight per tenant: a tenant cannot hold every thread and database connection of the API.

The API serves requests on a shared thread pool with a shared pool of database connections. Without a cap,
one tenant sending many requests at once would hold all of them, and every other tenant's requests would
queue behind its own. Past LEDGERFLOW_MAX_REQUESTS_PER_TENANT requests in flight, a tenant's next request
waits in that tenant's own line, on the event loop, holding no thread and no connection, and goes on as
one of its requests ends (first come, first served). Only a request that would make the line longer than
LEDGERFLOW_MAX_QUEUED_REQUESTS_PER_TENANT, or that has waited LEDGERFLOW_REQUEST_QUEUE_SECONDS, is
answered 429 `too_many_requests` with Retry-After (its body unread). So a busy tenant slows itself, never
the others, and a burst of one tenant is served rather than refused.

A read waiting for `min_cursor` holds no thread and no connection while it waits (`read_your_writes`): it
does not count then (waiting reads have caps of their own); it counts again once it reads.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import structlog
from fastapi.responses import JSONResponse

from ops.api.errors import error_response

log = structlog.get_logger(__name__)

SETTING: Final = "LEDGERFLOW_MAX_REQUESTS_PER_TENANT"
#: Seconds a refused caller is asked to wait: requests in flight usually end within a fraction of one.
RETRY_AFTER: Final = 1


class RequestsInFlight:
    """Counts each tenant's requests in flight, and lines up those past the cap (no lock: only the event
    loop touches it)."""

    def __init__(self, limit: int, *, max_queued: int = 256, max_wait: float = 30.0) -> None:
        self.limit = limit
        self.max_queued = max_queued
        self.max_wait = max_wait
        self._counts: Counter[str] = Counter()
        self._lines: dict[str, deque[asyncio.Future[None]]] = {}

    def of(self, tenant: str) -> int:
        return self._counts[tenant]

    def queued(self, tenant: str) -> int:
        """Requests of `tenant` waiting in its line."""
        return len(self._lines.get(tenant, ()))

    async def enter(self, tenant: str) -> bool:
        """Counts one more request of `tenant`, once it has fewer than `limit` in flight (waiting in its
        line until then); False, counting nothing, when its line is full or the wait ran out."""
        line = self._lines.get(tenant)
        if self._counts[tenant] < self.limit and not line:
            self._counts[tenant] += 1
            return True
        if line is None:
            line = self._lines[tenant] = deque()
        if len(line) >= self.max_queued:
            return False
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.append(slot)
        try:
            await asyncio.wait_for(asyncio.shield(slot), self.max_wait)
            return True
        except TimeoutError:
            return slot.done()  # handed over just as the wait ran out: it is this request's
        except asyncio.CancelledError:  # the client went away
            if slot.done():
                self.leave(tenant)  # the slot it was handed goes on to the next in line
            raise
        finally:
            if not slot.done():
                slot.cancel()
            if slot in line:
                line.remove(slot)
            if not line and self._lines.get(tenant) is line:
                del self._lines[tenant]

    def leave(self, tenant: str) -> None:
        """One request of `tenant` ended: its slot goes to the first of the tenant's line, if any."""
        line = self._lines.get(tenant)
        while line:
            slot = line.popleft()
            if not slot.done():
                slot.set_result(None)  # the count stays: the slot changes hands
                return
        self._counts[tenant] -= 1
        if self._counts[tenant] <= 0:
            del self._counts[tenant]

    @contextmanager
    def set_aside(self, tenant: str) -> Iterator[None]:
        """While inside, one of `tenant`'s requests does not count (it holds no thread nor connection)."""
        self.leave(tenant)
        try:
            yield
        finally:
            self._counts[tenant] += 1  # it was admitted already: it goes on even past the cap

    def refusal(self, tenant: str) -> JSONResponse:
        log.info("api_tenant_requests_refused", tenant=tenant, limit=self.limit, queued=self.max_queued)
        return error_response(
            429,
            "too_many_requests",
            f"tenant {tenant!r} has {self.limit} requests in flight, the most allowed ({SETTING}), and "
            f"this one found its line full or waited {self.max_wait:g}s in it; nothing was done; ask "
            "again after Retry-After seconds",
            {"limit": self.limit, "setting": SETTING},
            headers={"Retry-After": str(RETRY_AFTER)},
        )

"""Requests in flight per tenant: a tenant cannot hold every thread and database connection of the API.

The API serves requests on a shared thread pool with a shared pool of database connections. Without a cap,
one tenant sending many requests at once would hold all of them, and every other tenant's requests would
queue behind its own. Past LEDGERFLOW_MAX_REQUESTS_PER_TENANT requests in flight, a tenant's next request
waits in that tenant's own line, on the event loop, holding no thread and no connection, and goes on as
one of its requests ends (first come, first served). Only a request that would make the line longer than
LEDGERFLOW_MAX_QUEUED_REQUESTS_PER_TENANT, or that has waited LEDGERFLOW_REQUEST_QUEUE_SECONDS, is
answered 429 `too_many_requests` with Retry-After (its body unread). So a busy tenant slows itself, never
the others, and a burst of one tenant is served rather than refused.

The cap is shared out while several tenants have requests in flight (or waiting): each may then hold
`max(1, cap // tenants)`. The server's threads, its pool and the database's cores are shared, and a
tenant's request competes with every other request running: with one tenant holding its whole cap of
eight, another tenant's single request ran beside eight of the first's and took several times its quiet
latency (the noisy-neighbour drill). A tenant alone on the server still has the whole cap. A tenant past
its share (the share shrank as another tenant came) hands no slot on to its line until it is back
within its share; when the share grows again, waiting requests go on at once.

A request waiting for something to happen (a read waiting for `min_cursor`, a wait for a run's end) holds
no thread and no connection while it waits: it does not count then (waits have caps of their own,
`projector.ProjectionWaiters`). To read once its wait is over, it takes a place again as a new request
does, through its tenant's line and within the tenant's share (`set_aside`): many waits that end together
(every waiter of one run, or the runs one bulk cancel ended) read a share at a time, never all at once
beside the other tenants' requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import structlog
from fastapi.responses import JSONResponse

from ops.api.errors import error_response
from ops.api.lines import TenantLines

log = structlog.get_logger(__name__)

SETTING: Final = "LEDGERFLOW_MAX_REQUESTS_PER_TENANT"
#: Seconds a refused caller is asked to wait: requests in flight usually end within a fraction of one.
RETRY_AFTER: Final = 1


class NoPlaceAgain(Exception):
    """A request back from its wait found its tenant's line full, or waited in it too long (`set_aside`)."""


class RequestsInFlight:
    """Counts each tenant's requests in flight, and lines up those past the cap (`lines.TenantLines`; no
    lock: only the event loop touches it)."""

    def __init__(self, limit: int, *, max_queued: int = 256, max_wait: float = 30.0) -> None:
        #: The cap of a tenant alone on the server; shared out while several are active (`_share`).
        self.limit = limit
        self.max_queued = max_queued
        self.max_wait = max_wait
        self._lines: TenantLines[str, asyncio.Future[None]] = TenantLines(limit, max_queued)

    def of(self, tenant: str) -> int:
        return self._lines.held(tenant)

    def queued(self, tenant: str) -> int:
        """Requests of `tenant` waiting in its line."""
        return self._lines.waiting(tenant)

    async def enter(self, tenant: str) -> bool:
        """Counts one more request of `tenant`, once it has fewer than `limit` in flight (waiting in its
        line until then); False, counting nothing, when its line is full or the wait ran out."""
        self._share(arriving=tenant)
        if self._lines.take(tenant):
            return True
        if self._lines.full(tenant):
            return False
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lines.join(tenant, slot)
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
            self._lines.leave_line(tenant, slot)

    def leave(self, tenant: str) -> None:
        """One request of `tenant` ended: its slot goes to the first of the tenant's line, if any (and the
        tenant is within its share); and, when the share grew, waiting requests of any tenant go on."""
        self._lines.release(tenant, hand_to=_hand_over)
        self._share()
        for waiting in self._lines.waiting_keys():
            while (slot := self._lines.take_next(waiting)) is not None:
                if not _hand_over(slot):
                    self._lines.release(waiting)  # it had given up waiting: the slot is not taken

    def share(self) -> int:
        """What each tenant may hold now (see the module)."""
        return self._lines.limit

    def _share(self, arriving: str | None = None) -> None:
        active = self._lines.active()
        if arriving is not None:
            active.add(arriving)
        self._lines.limit = max(1, self.limit // max(1, len(active)))

    @asynccontextmanager
    async def set_aside(self, tenant: str) -> AsyncIterator[None]:
        """While inside, one of `tenant`'s requests does not count (it holds no thread nor connection). Left
        normally, it counts again once it has a place as a new request would (`enter`: the tenant's line,
        its share); `NoPlaceAgain` if it found none (the caller answers `refusal`). Left by an exception, it
        counts again at once: it only answers (an error, a timeout), it reads nothing more."""
        self.leave(tenant)
        try:
            yield
        except BaseException:
            self._lines.hold_again(tenant)  # its request's own `leave` gives it back as it ends
            raise
        placed = False
        try:
            placed = await self.enter(tenant)
        finally:
            if not placed:  # refused, or its client went away in the line: counted, as it ends, once
                self._lines.hold_again(tenant)
        if not placed:
            raise NoPlaceAgain(tenant)

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


def _hand_over(slot: asyncio.Future[None]) -> bool:
    """Wakes a request waiting in its line with the slot just freed; False if it gave up waiting."""
    if slot.done():
        return False
    slot.set_result(None)
    return True

"""Requests in flight per tenant: a tenant cannot hold every thread and database connection of the API.

The API serves requests on a shared thread pool with a shared pool of database connections. Without a cap,
one tenant sending many requests at once would hold all of them, and every other tenant's requests would
queue behind its own. Past LEDGERFLOW_MAX_REQUESTS_PER_TENANT requests in flight, a tenant's next request
is answered 429 `too_many_requests` with Retry-After at once (its body unread), whatever other tenants do.

A read waiting for `min_cursor` holds no thread and no connection while it waits (`read_your_writes`): it
does not count then (waiting reads have caps of their own); it counts again once it reads.
"""

from __future__ import annotations

from collections import Counter
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
    """Counts each tenant's requests in flight on the event loop (no lock: only the loop touches it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: Counter[str] = Counter()

    def of(self, tenant: str) -> int:
        return self._counts[tenant]

    def enter(self, tenant: str) -> bool:
        """Counts one more request of `tenant`; False (and counts nothing) when it has `limit` already."""
        if self._counts[tenant] >= self.limit:
            return False
        self._counts[tenant] += 1
        return True

    def leave(self, tenant: str) -> None:
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
        log.info("api_tenant_requests_refused", tenant=tenant, limit=self.limit)
        return error_response(
            429,
            "too_many_requests",
            f"tenant {tenant!r} has {self.limit} requests in flight, the most allowed; the limit is "
            f"{SETTING}; nothing was done; ask again after Retry-After seconds",
            {"limit": self.limit, "setting": SETTING},
            headers={"Retry-After": str(RETRY_AFTER)},
        )

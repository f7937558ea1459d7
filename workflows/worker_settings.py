"""A workflow worker's settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 4
    lease_ttl: float = 10.0
    heartbeat_interval: float = 2.0
    recovery: bool = True
    recovery_interval: float = 2.0
    poll_interval: float = 0.5
    #: On stop, how long running nodes get to reach a context call before their leases are handed back.
    shutdown_grace: float = 10.0
    #: On stop, how long the steps that need the database (a last heartbeat, handing nodes back) may wait
    #: for it past the grace; skipped after that: the leases lapse by themselves, and peers take over.
    shutdown_database_timeout: float = 3.0
    #: `async def` nodes run at once on the worker's event loop, apart from the `concurrency` threads.
    async_concurrency: int = 100
    #: Threads that make the database calls of `async def` nodes, so the event loop never waits for one.
    async_io_threads: int = 4

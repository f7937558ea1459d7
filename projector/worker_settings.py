"""A projector worker's settings: lease timing, batch size, retries, shutdown and balancing."""

from __future__ import annotations

from dataclasses import dataclass, field

from projector.retries import RetrySettings


@dataclass(frozen=True)
class WorkerSettings:
    lease_ttl: float = 10.0
    heartbeat_interval: float = 3.0
    #: A run whose heartbeat is older than this is marked abandoned.
    abandoned_after: float = 30.0
    batch_size: int = 1000
    poll_interval: float = 1.0
    retry: RetrySettings = field(default_factory=RetrySettings)
    #: On stop, how long releasing the leases (and closing their runs) may wait for the database; skipped
    #: after that: the leases lapse by themselves, and a standby takes over.
    shutdown_database_timeout: float = 3.0
    #: How often a worker looks at the spread of partitioned projections' segments over the live workers
    #: (one query of the leases and of the connected workers), and takes or hands over segments.
    balance_interval: float = 0.5

"""The connections a long-running process may hold, stated at its start (`connection_budget`).

Every role works within its pool (`LEDGERFLOW_POOL_MIN_SIZE` kept open, up to `LEDGERFLOW_POOL_MAX_SIZE`,
the connections past the minimum closed once idle for `LEDGERFLOW_POOL_MAX_IDLE` seconds) plus a few
connections of its own: a workflow worker's listener, presence and notifier (and a listener for
its trigger projections when a workflow has triggers), a projector's listener. The notifier's is closed,
as pooled ones are, once it has sent no wake-up for `LEDGERFLOW_POOL_MAX_IDLE` seconds (see
`eventstore.notify`), so a process at rest holds it no more. No thread holds a pooled
connection while it waits for another (see `eventstore.pooling`), so a process that holds even one pooled
connection makes progress; one that has none waits, backing off with jitter, until the server has a slot.
Size `max_connections` from these figures: the sum of `most` over every process, plus the operators'; a
fleet at rest holds the sum of `at_rest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from ops.settings import Settings

log = structlog.get_logger(__name__)

#: Connections of a process's own that it closes once idle, as it does its pool's past the minimum.
CLOSED_WHEN_IDLE = frozenset({"notifier"})


@dataclass(frozen=True)
class ConnectionBudget:
    role: str
    pool_min: int
    pool_max: int
    #: Seconds after which a pooled connection past `pool_min` is closed once idle.
    pool_max_idle: float
    #: Of the pool's connections, how many appending threads may keep between appends.
    pinned_max: int
    #: Connections outside the pool, by purpose.
    dedicated: dict[str, int] = field(default_factory=dict)

    @property
    def most(self) -> int:
        """The most connections the process holds at once."""
        return self.pool_max + sum(self.dedicated.values())

    @property
    def at_rest(self) -> int:
        """The connections it holds once it has been idle for `pool_max_idle` (1.5 times it at most)."""
        return self.pool_min + sum(
            n for purpose, n in self.dedicated.items() if purpose not in CLOSED_WHEN_IDLE
        )

    @property
    def least(self) -> int:
        """The connections it needs to work at all: one pooled connection (the rest may wait)."""
        return max(self.pool_min, 1)


def budget(role: str, settings: Settings, *dedicated: dict[str, int]) -> ConnectionBudget:
    pinned = (
        settings.pool_max_size // 2 if settings.pinned_connections is None else settings.pinned_connections
    )
    merged: dict[str, int] = {}
    for part in dedicated:
        for purpose, count in part.items():
            merged[purpose] = merged.get(purpose, 0) + count
    return ConnectionBudget(
        role=role,
        pool_min=settings.pool_min_size,
        pool_max=settings.pool_max_size,
        pool_max_idle=settings.pool_max_idle,
        pinned_max=min(pinned, settings.pool_max_size),
        dedicated=merged,
    )


def log_connection_budget(b: ConnectionBudget) -> None:
    log.info(
        "connection_budget",
        role=b.role,
        most=b.most,
        least=b.least,
        at_rest=b.at_rest,
        pool_min=b.pool_min,
        pool_max=b.pool_max,
        pool_max_idle=b.pool_max_idle,
        pinned_max=b.pinned_max,
        **{f"own_{purpose}": count for purpose, count in sorted(b.dedicated.items())},
    )

"""What the health endpoints ask the database. The only module of `ops.api` that runs SQL."""

from __future__ import annotations

from dataclasses import dataclass

from eventstore import (
    EventStore,
    Migration,
    applied_versions,
    load_queries,
    pending_migrations,
    wrap_exceptions,
)

Q = load_queries("ops.api")


@dataclass(frozen=True)
class MigrationStatus:
    applied: list[int]
    pending: list[Migration]


def ping(store: EventStore, timeout: float) -> None:
    """Raise DatabaseUnavailableError unless the database answers `SELECT 1` within about `timeout`."""
    with wrap_exceptions(), store.pool.connection(timeout=timeout) as conn:
        conn.execute(Q["ping"]).fetchone()


def migration_status(store: EventStore, timeout: float) -> MigrationStatus:
    with wrap_exceptions(), store.pool.connection(timeout=timeout) as conn:
        return MigrationStatus(sorted(applied_versions(conn)), pending_migrations(conn))


def live_workflow_workers(store: EventStore, *, recent_seconds: float, timeout: float) -> list[str]:
    """Names of workflow workers seen alive: holding a node lease, or sweeping for orphans lately."""
    with wrap_exceptions(), store.pool.connection(timeout=timeout) as conn:
        rows = conn.execute(Q["live_workflow_workers"], {"recent_seconds": recent_seconds}).fetchall()
    return [str(r[0]) for r in rows]

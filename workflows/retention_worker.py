"""Retention as a long-running role: a retention pass (`workflows.retention`) over every tenant, every
LEDGERFLOW_RETENTION_INTERVAL seconds (0: never), in `ledgerflow serve`'s `retention` role.

- **One pass at a time across every process.** A tick takes a session lock of the database
  (`pg_try_advisory_lock`); a process that finds it held skips its tick. A killed process's lock goes
  with its connection, so the next tick anywhere takes over at once. (Without the lock a run would still
  be released once: a release is appended at the run stream's version its checks read, and a run found
  released already is skipped; the lock saves the duplicate work.)
- **Bounded.** Each pass takes at most LEDGERFLOW_RETENTION_BATCH runs per workflow and tenant, as a
  recorded bulk action of kind `release`; while a pass fills a batch, the tick runs another at once over
  the runs started before those it processed (between two, the stop signal is heard), so a backlog drains
  at the pass's rate and a quiet database costs one skip scan per tick.
- A pass a killed process left running is finished by the next tick (`retention_pass` first finishes the
  release actions that stopped). A pass the database's outage stopped is finished as soon as the database
  answers again: the role waits the outage out, then ticks at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import structlog

from eventstore import EventStore, LedgerflowError, MissingRelationError
from eventstore.spi import (
    Outage,
    OutageState,
    fetch_value,
    fetch_values,
    is_unavailable,
    load_queries,
    through_outages,
)
from workflows.bulk_records import BulkAction
from workflows.engine import Engine
from workflows.errors import wrap_exceptions
from workflows.releases import RetentionSettings
from workflows.retention import reached, retention_pass

log = structlog.get_logger("workflows.retention")
Q = load_queries("workflows", "retention.sql")


@dataclass(frozen=True)
class Tick:
    """What one tick did: None in `actions` when another process was passing (nothing was done)."""

    actions: list[BulkAction] | None

    @property
    def released(self) -> int:
        return sum(a.done for a in self.actions or [])


class RetentionWorker:
    """Runs retention passes every `settings.retention_interval` seconds until stopped (the `Worker` of a
    role: `run`, `stop`, `database_state`)."""

    def __init__(
        self, engine: Engine, settings: RetentionSettings | None = None, *, actor: str = "retention"
    ) -> None:
        self.engine = engine
        self.settings = settings if settings is not None else RetentionSettings()
        self.actor = actor
        self.stopping = threading.Event()
        self.outage = Outage(role="retention")

    def run(self) -> None:
        interval = self.settings.retention_interval
        if interval <= 0:
            log.info("retention_role_off", setting="LEDGERFLOW_RETENTION_INTERVAL")
            self.stopping.wait()
            return
        while not self.stopping.is_set():
            try:
                # The database going away, maybe in the middle of a pass, is waited out, and the tick runs
                # again as soon as it answers (the pass first finishes the actions it left), not an
                # interval later.
                through_outages(self.tick, self.engine.store.pool, self.outage, self.stopping)
            except LedgerflowError as exc:
                if is_unavailable(exc) and self.stopping.is_set():
                    return  # stopped while the database was away
                raise  # a bug: the role restarts it, with back-off
            self.stopping.wait(interval)

    def stop(self) -> None:
        self.stopping.set()

    def database_state(self) -> OutageState:
        return self.outage.snapshot()

    def tick(self) -> Tick:
        """One tick: every tenant's due runs, pass after pass while passes fill their batches, unless
        another process is passing now."""
        with _sole_pass(self.engine.store) as sole:
            if not sole:
                log.info("retention_pass_elsewhere")
                return Tick(None)
            worked: list[BulkAction] = []
            batch = self.settings.retention_batch
            for tenant in _tenants(self.engine.store):
                below: dict[str, datetime] = {}
                while not self.stopping.is_set():
                    actions = retention_pass(
                        self.engine,
                        tenant=tenant,
                        actor=self.actor,
                        settings=self.settings,
                        started_before=below,
                    )
                    worked += actions
                    # Another pass at once while this one filled a batch, over the runs started before
                    # those it processed: the run tables show released runs until the projector has
                    # applied their release, and each pass walks newest first. Each pass moves the bound
                    # down, so the tick ends; runs it passes over wait for the next tick.
                    full = [a for a in actions if a.matched >= batch and a.processed > 0]
                    if not full:
                        break
                    below.update(reached(self.engine.store, full))
        tick = Tick(worked)
        log.info("retention_tick", actions=len(worked), released=tick.released)
        return tick


@contextmanager
def _sole_pass(store: EventStore) -> Iterator[bool]:
    with wrap_exceptions(), store.pool.connection() as conn:
        held = bool(fetch_value(conn, Q["try_pass_lock"]))
        try:
            yield held
        finally:
            if held:
                conn.execute(Q["pass_unlock"])


def _tenants(store: EventStore) -> list[str]:
    """The tenants with ended runs in the run tables (none before a projector has created them)."""
    try:
        with wrap_exceptions(), store.pool.connection() as conn:
            return fetch_values(conn, Q["tenants"])
    except MissingRelationError:
        return []

"""Claiming nodes for a worker: as many as it has room for, in its threads and on its event loop, their
runs' states read together, and spaced out while claims keep finding nothing."""

from __future__ import annotations

import copy
import threading
import time
import uuid

import structlog

from eventstore import ConflictError
from eventstore.spi import is_unavailable
from workflows import metrics, queue_claims
from workflows.aio import StartedTogether
from workflows.errors import wrap_exceptions
from workflows.node_end_writes import record_appended
from workflows.node_runs import NodeRuns
from workflows.queue_claims import Claim
from workflows.run_state import RunState

log = structlog.get_logger(__name__)


class EmptyClaims:
    """Spacing of claims that keep finding nothing. Every append anywhere wakes the claim loop (one
    notification channel for all events), so a worker with free slots would claim again after each of the
    other workers' node ends, finding nothing while they drain the queue: a transaction each time, for
    nothing. After each empty claim in a row the next one waits a little longer (2 ms, doubling up to
    20 ms); a claim that finds work resets the spacing, and a first claim after a quiet spell is never
    delayed."""

    def __init__(self, first: float = 0.002, longest: float = 0.02) -> None:
        self._first = first
        self._longest = longest
        self._spacing = 0.0
        self._last = 0.0

    def wait(self, stopping: threading.Event) -> None:
        pause = self._last + self._spacing - time.monotonic()
        if pause > 0:
            stopping.wait(pause)

    def record(self, found: bool) -> None:
        self._last = time.monotonic()
        self._spacing = 0.0 if found else min(max(self._spacing * 2, self._first), self._longest)


class NodeClaims(NodeRuns):
    _empty_claims: EmptyClaims

    def claim_and_start(self) -> bool:
        """Claim as many nodes as there are free slots and start them; True if any was claimed."""
        if not self._budgets() or self.stopping.is_set():
            return False
        self._empty_claims.wait(self.stopping)
        self._interrupts.wait(self.stopping)
        if self.stopping.is_set():
            return False
        try:
            with self._claiming:
                claims = self._claim(budgets=self._budgets())
                self._empty_claims.record(bool(claims))
                self._start_claimed(claims)
        except Exception as exc:
            if is_unavailable(exc):
                self.outage.failed(exc)  # the loop waits for the database before claiming again
            elif isinstance(exc, ConflictError):
                # Expected contention with other workers (a run changed under the claim): claim again.
                log.debug("workflow_claim_conflict", error=str(exc))
            else:
                log.exception("workflow_claim_failed", error=str(exc))
                self.stopping.wait(self.settings.poll_interval)
            return False
        return bool(claims)

    def _start_claimed(self, claims: list[Claim]) -> None:
        """Start nodes claimed for this worker, their runs' states read in one query per tenant."""
        if not claims:
            return
        try:
            states = self._load_claimed(claims)
        except Exception as exc:
            if is_unavailable(exc):
                self.outage.failed(exc)
            else:
                log.warning("workflow_claimed_runs_not_loaded", error=str(exc))
            states = {}  # each node loads its own
        # Their bodies all start before any of their ends is recorded (see StartedTogether).
        together = StartedTogether(len(claims)) if len(claims) > 1 else None
        for claim, state in zip(claims, self._own_copies(claims, states), strict=True):
            self._start(claim, state, together)

    def _budgets(self) -> list[tuple[list[str], int]]:
        """What to claim now, for the free threads and the free places on the event loop."""
        with self._lock:
            on_loop = len(self._on_loop)
            in_threads = len(self._running) - on_loop
        return self._kinds.budgets(
            self.settings.concurrency - in_threads, self.settings.async_concurrency - on_loop
        )

    def _claim(self, limit: int = 0, *, budgets: list[tuple[list[str], int]] | None = None) -> list[Claim]:
        """Claim up to `limit` ready nodes of any of the worker's workflows, or, with `budgets`, up to so
        many of each group of workflows; one statement per group."""
        if budgets is None:
            budgets = [(self.registry.names(), limit)]
        store = self.engine.store
        claims: list[Claim] = []
        # One statement per group, in autocommit: the claim and its NodeClaimed events (see `claim` in
        # queries.sql), one round trip, one transaction.
        with wrap_exceptions(), store.pool.connection() as conn:
            for workflows, group_limit in budgets:
                began = time.perf_counter()
                got, appended = queue_claims.claim_later(
                    conn,
                    worker_name=self.name,
                    instance=self.instance,
                    worker_id=self.id,
                    # Every version it has of each: a run goes on with the version it started with.
                    workflows=[(n, v) for n in workflows for v in self.registry.versions(n)],
                    limit=group_limit,
                    ttl=self.settings.lease_ttl,
                )()
                record_appended(store, got, appended, began)
                claims += got
        # No wake-up when nothing was claimed: this worker's own listener would take it and claim
        # again at once, spinning on empty claims.
        if claims:
            store.notify_appended()
            metrics.nodes_claimed.add(len(claims))
        return claims

    def _load_claimed(self, claims: list[Claim]) -> dict[uuid.UUID, RunState]:
        """The claimed runs' states, one query per tenant rather than one per node (after a restart a
        worker may claim a thousand nodes at once)."""
        by_tenant: dict[str, list[uuid.UUID]] = {}
        for c in claims:
            by_tenant.setdefault(c.tenant, []).append(c.run_id)
        states: dict[uuid.UUID, RunState] = {}
        for tenant, run_ids in by_tenant.items():
            states.update(self.engine.load_many(run_ids, tenant=tenant))
        return states

    @staticmethod
    def _own_copies(claims: list[Claim], states: dict[uuid.UUID, RunState]) -> list[RunState | None]:
        """Each claimed node's own copy of its run's state: every node's thread advances its copy with
        what it writes, so two nodes of one run never share one."""
        seen: set[uuid.UUID] = set()
        copies: list[RunState | None] = []
        for c in claims:
            state = states.get(c.run_id)
            copies.append(copy.deepcopy(state) if state is not None and c.run_id in seen else state)
            seen.add(c.run_id)
        return copies

"""What every part of the engine stands on: its collaborators (store, registry, caps, quotas, tag
limits), reading runs (a snapshot with the events after it folded in), and the transactions and
optimistic-concurrency loop its writes go through.

`workflows.engine.Engine` puts the parts together: starting runs (`run_starts`), signals
(`run_signals`) and operator actions (`operator_actions`), each a subclass of `EngineCore`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from eventstore import ConflictError, EventStore, NewEvent, NotFoundError, WrongExpectedVersionError
from eventstore.spi import check_tenant
from workflows import events as ev
from workflows import pipelined_transactions, release_marks, snapshots
from workflows.caps import RunCaps
from workflows.errors import RunStateError, wrap_exceptions
from workflows.quotas import TenantQuotas
from workflows.run_state import RunState
from workflows.tags import TagLimits
from workflows.workflow_registry import WorkflowRegistry

#: How often a write that lost a race on the run's stream version reads the run again and decides again.
OCC_ATTEMPTS = 50


class EngineCore:
    def __init__(
        self,
        store: EventStore,
        registry: WorkflowRegistry,
        caps: RunCaps | None = None,
        *,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        #: What one run may hold (LEDGERFLOW_MAX_SIGNALS_PER_RUN, ...): from the environment by default.
        self.caps = caps if caps is not None else RunCaps()
        #: Per-tenant quotas on starts (None: none); see workflows.quotas.
        self.quotas = quotas
        #: Bounds on run tags (LEDGERFLOW_MAX_TAGS_PER_RUN, ...): from the environment.
        self.tag_limits = TagLimits()

    # -- reading --------------------------------------------------------------------------------------

    def load(self, run_id: uuid.UUID, *, tenant: str = "default") -> RunState:
        """The run's current state: its snapshot with the events after it folded in (workflows.snapshots),
        signals by reference."""
        check_tenant(tenant)
        run = snapshots.load_runs(
            self.store, [run_id], tenant=tenant, snapshot_every=self.caps.run_snapshot_every
        ).get(run_id)
        if run is None or not run.workflow:
            # Not in the log now, or not whole: its events may have left with archived partitions (its
            # stream's row stays), which an operator can bring back. Partitions leave oldest first, so a
            # run that keeps some events has lost its start with the others: with no snapshot to start
            # from, the rest would fold into a run that never was.
            with wrap_exceptions(), self.store.pool.connection() as conn:
                missing = release_marks.events_missing(conn, run_id, tenant)
            if missing:
                raise NotFoundError(release_marks.archived_events_message(run_id, missing))
            raise NotFoundError(
                f"no run {run_id} (tenant {tenant!r}); list runs with `ledgerflow workflows list`"
            )
        return run

    def catch_up(self, run: RunState) -> RunState:
        """Advance `run`, in place, with the events appended to its stream after the version it knows:
        a worker that holds a run reads only what it has not seen."""
        snapshots.catch_up(self.store, [run])
        return run

    def load_many(
        self, run_ids: Sequence[uuid.UUID], *, tenant: str = "default"
    ) -> dict[uuid.UUID, RunState]:
        """Several runs' states in one query each for snapshots and events (runs not found are left out)."""
        unique = list(dict.fromkeys(run_ids))
        every = self.caps.run_snapshot_every
        return snapshots.load_runs(self.store, unique, tenant=tenant, snapshot_every=every)

    def signal_payload(self, run: RunState, index: int) -> Any:
        """The payload of the run's `index`-th signal: the fold keeps signals by reference."""
        return snapshots.signal_payload(self.store, run, index)

    # -- plumbing -------------------------------------------------------------------------------------

    @contextmanager
    def transaction(self, notify: Callable[[], bool] | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A transaction for appends plus queue changes; subscribers are woken after it commits (unless
        `notify` says there is nothing to wake them for)."""
        with self.store.pool.connection() as conn, conn.transaction():
            yield conn
        if notify is None or notify():
            self.store.notify_appended()

    @contextmanager
    def pipelined_transaction(
        self, notify: Callable[[], bool] | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """`transaction()`, with its statements sent in a pipeline: two round trips when one result is
        fetched midway (see `pipelined_transactions.pipelined_transaction`)."""
        with self.store.pool.connection() as conn, pipelined_transactions.pipelined_transaction(conn):
            yield conn
        if notify is None or notify():
            self.store.notify_appended()

    def _refuse_released(self, run_id: uuid.UUID, tenant: str, action: str) -> None:
        """A released run is not in the run tables: reopened, it would run unseen. Its append still names
        the version this check read, so a release that lands in between makes the append fail and the
        check run again."""
        with wrap_exceptions(), self.store.pool.connection() as conn:
            release = release_marks.current_release(conn, run_id, tenant)
        if release is not None:
            raise RunStateError(
                f"run {run_id} was released by retention at {release.released_at.isoformat()}; "
                f"restore it first (`ledgerflow workflows restore {run_id}`), then {action} it"
            )

    def _repeated(self, idempotency_key: str | None, tenant: str) -> bool:
        """Whether an operator action under `idempotency_key` was already recorded: its repeat does
        nothing (whatever the run's state is now, e.g. a retried run that failed again)."""
        return idempotency_key is not None and self.store.idempotency_key_used(idempotency_key, tenant=tenant)

    def _record_action(
        self, conn: Any, run: RunState, event: NewEvent, *, idempotency_key: str | None
    ) -> None:
        """Append an operator action's event to its run's stream, in `conn`'s transaction, at the version
        the action's decision read (a run changed meanwhile fails it: `_with_occ` decides again), under the
        action's idempotency key."""
        self.store.append(
            ev.run_stream(run.run_id),
            [event],
            expected_version=run.version,
            idempotency_key=idempotency_key,
            tenant=run.tenant,
            conn=conn,
        )

    @staticmethod
    def _with_occ(attempt: Callable[[], None]) -> None:
        for _ in range(OCC_ATTEMPTS):
            try:
                attempt()
                return
            except WrongExpectedVersionError:
                continue  # the run changed under us: read it again and decide again
        raise ConflictError("the run changed too often to apply the request; retry")

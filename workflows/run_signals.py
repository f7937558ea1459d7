"""Signals to runs: a signal is recorded in the run's stream, under the run's queue rows' locks, and wakes
the node that waits for it; a repeat under its idempotency key is recorded once, and gets the first
send's answer even after the run has ended."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

import structlog

from eventstore import AppendResult, NewEvent, NotFoundError, StreamAppend
from eventstore.spi import check_idempotency_key, check_tenant
from workflows import events as ev
from workflows import new_events as new
from workflows import queue_run_changes, snapshots
from workflows.engine_core import EngineCore
from workflows.errors import RunSignalLimitError, RunStateError

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class SignalSent:
    run_id: uuid.UUID
    name: str
    #: The log position of the SignalReceived event (of the first send, for a repeat).
    position: int
    #: True when the idempotency key matched an earlier send: nothing new was recorded.
    duplicate: bool


class RunSignals(EngineCore):
    def signal(
        self,
        run_id: uuid.UUID,
        name: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        tenant: str = "default",
        actor: str | None = None,
    ) -> SignalSent:
        """Send signal `name` with `payload` to a run: the earliest wait for `name` that has not taken a
        signal yet gets it (`NodeContext.wait_for_signal`), now if a node waits for it, or later when one
        does. A repeat with the same `idempotency_key` is recorded once."""
        check_tenant(tenant)
        ev.check_signal_name(name)
        self.caps.check_signal(payload)
        stream = ev.run_stream(run_id)
        received = new.signal_received(run_id=run_id, name=name, payload=payload, actor=actor)
        key = None
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
            # Scoped to the run (the same key may be used for every run), at a fixed length.
            key = "signal:" + hashlib.sha256(f"{run_id}\x00{idempotency_key}".encode()).hexdigest()
        with self.pipelined_transaction() as conn:
            # The run's queue rows first (the order every node end takes too): see
            # queue_run_changes.lock_run_nodes.
            active = queue_run_changes.lock_run_nodes(conn, run_id, tenant)
            if active:
                result = self.store.append(stream, [received], idempotency_key=key, tenant=tenant, conn=conn)
                if not result.duplicate:
                    limit = self.caps.max_signals_per_run
                    if not snapshots.count_signal(conn, run_id, tenant, limit):
                        # Raised inside the transaction: the append above rolls back with it.
                        raise RunSignalLimitError(str(run_id), limit, "LEDGERFLOW_MAX_SIGNALS_PER_RUN")
                    queue_run_changes.wake_waiting(conn, run_id, name)
        if not active:
            # A repeat of a send whose answer was lost may come after the signal let the run end: it gets
            # the first send's answer, not a refusal.
            repeated = self._repeated_send(stream, received, key, tenant) if key is not None else None
            if repeated is not None:
                return SignalSent(run_id, name, repeated.last_position, duplicate=True)
            last = self.store.read_stream(stream, tenant=tenant, backward=True, limit=1)
            if not last:
                raise NotFoundError(
                    f"no run {run_id} (tenant {tenant!r}); list runs with `ledgerflow workflows list`"
                )
            raise RunStateError(
                f"run {run_id} has ended ({last[0].type}); no node would ever take the signal"
            )
        log.info("workflow_signal_sent", run_id=str(run_id), signal=name, duplicate=result.duplicate)
        return SignalSent(run_id, name, result.last_position, result.duplicate)

    def _repeated_send(self, stream: str, received: NewEvent, key: str, tenant: str) -> AppendResult | None:
        """The first send's result if `key` already recorded this signal, else None: a read of the key's
        record, which writes nothing. A key used for other content (another name or payload) raises
        IdempotencyConflictError, as the append would."""
        first = [StreamAppend(stream, [received])]
        return self.store.earlier_append(first, idempotency_key=key, tenant=tenant)

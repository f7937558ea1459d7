"""Signals and errors of workflow execution.

The signals derive from BaseException: node code that catches Exception must not swallow them, or a
worker that lost its lease would go on working as if it had not.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from eventstore.db import Translation
from eventstore.db import wrap_exceptions as _wrap_exceptions
from eventstore.errors import ConflictError, LedgerflowError

# SQLSTATEs raised by ledgerflow.wf_fence (migrations/0003_workflows.sql).
LEASE_LOST = "LF004"
RUN_CANCELLED = "LF005"


class NodeLeaseLost(BaseException):
    """This worker's claim on the node is gone (lease lapsed or reclaimed); it must stop at once."""


class RunCancelled(BaseException):
    """The run was cancelled; the node stops at its next context call."""


class WorkerStopping(BaseException):
    """The worker is shutting down; the node stops and is handed to another worker."""


class NodeSuspended(BaseException):
    """The node waits (a durable timer, or a signal that has not come): its worker records the wait, lets
    go of the node and of its thread, and the node's body runs again from the start when it wakes."""

    def __init__(self, key: str, until: datetime | None, signal: str | None = None) -> None:
        what = f"signal {signal!r}" if signal is not None else "a timer"
        super().__init__(f"waiting for {what} until {until.isoformat() if until else 'it comes'}")
        self.key = key
        self.until = until
        self.signal = signal


class SignalTimeout(LedgerflowError, TimeoutError):
    """`NodeContext.wait_for_signal` ran past its timeout with no signal; the node may handle it."""

    code = "signal_timeout"


class NodeTimeout(LedgerflowError, TimeoutError):
    code = "node_timeout"


class NodeStuckError(LedgerflowError):
    code = "node_stuck"


class RunStateError(ConflictError):
    """The run is not in a state that allows the request (e.g. retrying a run that succeeded)."""

    code = "run_state_conflict"


#: The workflow SQL's own SQLSTATEs, as the signals a node's worker acts on.
SQLSTATES: dict[str, Translation] = {
    LEASE_LOST: lambda exc: NodeLeaseLost(str(exc.diag.message_detail)),
    RUN_CANCELLED: lambda exc: RunCancelled(str(exc.diag.message_detail)),
}


def wrap_exceptions() -> AbstractContextManager[None]:
    """The boundary between psycopg and the workflows package: driver errors become ledgerflow errors,
    and the fence's SQLSTATEs the signals above (`__cause__` is the driver's error)."""
    return _wrap_exceptions(SQLSTATES)

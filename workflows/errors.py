"""Signals and errors of workflow execution.

The signals derive from BaseException: node code that catches Exception must not swallow them, or a
worker that lost its lease would go on working as if it had not.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from eventstore import ConflictError, InvalidInputError, LedgerflowError
from eventstore.spi import Translation
from eventstore.spi import wrap_exceptions as _wrap_exceptions

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


class ContinueAsNew(BaseException):
    """The node ends its run by starting the run's successor (`NodeContext.continue_as_new`): its worker
    records the node's success, the run's end and the successor's start in one transaction."""

    def __init__(self, input: Any, tags: dict[str, str] | None) -> None:
        super().__init__("continuing as a new run")
        self.input = input
        self.tags = tags


class SignalTimeout(LedgerflowError, TimeoutError):
    """`NodeContext.wait_for_signal` ran past its timeout with no signal; the node may handle it."""

    code = "signal_timeout"


class NodeTimeout(LedgerflowError, TimeoutError):
    code = "node_timeout"


class NodeStuckError(LedgerflowError):
    code = "node_stuck"


class RepeatedStepKeyError(InvalidInputError):
    """A node's body asked for the same step key twice in one run of the body. The second call would get
    the first one's recorded result without running its own function: give each step its own key (for
    steps in a loop, put the item in the key)."""

    code = "repeated_step_key"

    def __init__(self, node: str, key: str) -> None:
        self.node, self.key = node, key
        super().__init__(
            f"node {node!r} asked for step {key!r} twice in one run of its body; the second call would "
            f'return the first\'s result without running. Give each step its own key, e.g. f"{key}:{{item}}".'
        )

    def details(self) -> dict[str, Any]:
        return {"node": self.node, "key": self.key}


class RunStateError(ConflictError):
    """The run is not in a state that allows the request (e.g. retrying a run that succeeded)."""

    code = "run_state_conflict"


class BatchUnfit(Exception):
    """A batch of runs (a bulk action's page) cannot be acted on as one: its caller takes the runs one at
    a time instead, where each run's own outcome is reported."""


#: The workflow SQL's own SQLSTATEs, as the signals a node's worker acts on.
SQLSTATES: dict[str, Translation] = {
    LEASE_LOST: lambda exc: NodeLeaseLost(str(exc.diag.message_detail)),
    RUN_CANCELLED: lambda exc: RunCancelled(str(exc.diag.message_detail)),
}


def wrap_exceptions() -> AbstractContextManager[None]:
    """The boundary between psycopg and the workflows package: driver errors become ledgerflow errors,
    and the fence's SQLSTATEs the signals above (`__cause__` is the driver's error)."""
    return _wrap_exceptions(SQLSTATES)


class PayloadTooLargeError(InvalidInputError):
    """A payload a run would keep (a start's input, a signal's payload, a node's output, a step's result or
    a checkpoint's output) is over its cap; nothing was written. The HTTP API answers 413."""

    code = "payload_too_large"

    def __init__(self, what: str, size: int, limit: int, setting: str) -> None:
        self.what, self.size, self.limit, self.setting = what, size, limit, setting
        super().__init__(
            f"{what} is {size} bytes of JSON; the limit is {limit} ({setting}). Nothing was written: "
            "store large payloads elsewhere and pass a reference."
        )

    def details(self) -> dict[str, Any]:
        return {"size": self.size, "limit": self.limit, "setting": self.setting}


class RunSignalLimitError(ConflictError):
    """The run has received as many signals as one run may (LEDGERFLOW_MAX_SIGNALS_PER_RUN); nothing was
    written. Waiting does not help: the count only grows. The HTTP API answers 409."""

    code = "run_signal_limit"

    def __init__(self, run_id: str, limit: int, setting: str) -> None:
        self.run_id, self.limit, self.setting = run_id, limit, setting
        super().__init__(
            f"run {run_id} has received {limit} signals, the most one run may ({setting}); nothing was "
            "written. Start a new run for further work, or raise the limit."
        )

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "limit": self.limit, "setting": self.setting}

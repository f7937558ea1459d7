"""How long a worker waits before it claims again after its nodes were interrupted by the database.

A node is interrupted when the database fails under it: its own writes, the recording of its end, or a
connection its body opens. It is handed back without counting an attempt, and the claim loop waits until
the database answers before it claims again. That wait ends at once when the worker's pool still answers:
a node whose body needs a connection the server will not give (every slot taken by other processes), or
whose statements keep failing while a ping succeeds, would be claimed, interrupted and handed back in a
tight loop, hundreds of times a second across the fleet, each time a NodeReleased in the log and a
refused connection attempt at the server.

So each interruption in a row pushes the next claim back (`outage.retry_delay`: 50 ms doubling for an
outage, with full jitter and up to 15 s against a full server, so that waiting workers spread out
instead of retrying together and the processes that hold connections finish their work). A node that
ends normally resets the count: a worker that makes progress claims at full speed.
"""

from __future__ import annotations

import threading
import time

import structlog

from eventstore.spi import retry_delay

log = structlog.get_logger(__name__)


class InterruptBackoff:
    """Thread-safe: node threads record, the claim loop waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._resume_at = 0.0

    def interrupted(self, exc: BaseException) -> float:
        """A node was interrupted by `exc`: returns the delay before the next claim."""
        with self._lock:
            self._in_a_row += 1
            delay = retry_delay(self._in_a_row, exc)
            self._resume_at = max(self._resume_at, time.monotonic() + delay)
            in_a_row = self._in_a_row
        log.info("workflow_claims_backing_off", seconds=round(delay, 3), interruptions_in_a_row=in_a_row)
        return delay

    def progressed(self) -> None:
        """A node ended normally: claims go on at full speed."""
        if self._in_a_row:
            with self._lock:
                self._in_a_row = 0
                self._resume_at = 0.0

    def wait(self, stopping: threading.Event) -> None:
        """Before a claim: wait out the back-off (or until the worker stops)."""
        pause = self._resume_at - time.monotonic()
        if pause > 0:
            stopping.wait(pause)

    @property
    def in_a_row(self) -> int:
        return self._in_a_row

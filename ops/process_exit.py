"""The end of a long-running command: exit even when a node body is stuck.

A workflow worker's graceful stop gives running nodes a grace period, then hands back the ones still
running: their leases are fenced and another worker takes them up from their last checkpoint. A body
that does not return (here, a call blocked on a server that died under it) is then nobody's work, but
its thread is not a daemon (concurrent.futures' threads never are), and the interpreter would wait for
it at exit for ever: the process would hold its sockets and outlive its supervisor's patience.

Exiting past such a thread skips the interpreter's exit handlers, as a crash would: an embedded
PostgreSQL this process started is then left running, and the next ledgerflow process uses it again.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import structlog

log = structlog.get_logger(__name__)


def exit_past_stuck_threads(wait: float = 2.0) -> None:
    """Return if every non-daemon thread but this one ends within `wait` seconds; otherwise say which
    are left and end the process now, with status 0: the stop did all it could, and what the stuck
    bodies would still do is fenced (as after a crash)."""
    deadline = time.monotonic() + wait
    for thread in _others():
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in _others() if t.is_alive()]
    if not stuck:
        return
    log.warning("process_exiting_past_stuck_threads", threads=stuck)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _others() -> list[threading.Thread]:
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not t.daemon]

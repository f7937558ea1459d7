"""Ending the sessions of frozen worker processes, so their row locks cannot outlive their leases.

Every worker heartbeat calls `end_frozen_sessions` with its lease length: a process frozen inside a
transaction (SIGSTOP, a long pause) past a lease has lost that lease anyway, and its transaction, which
could only be fenced off at commit, must not keep holding the rows a peer needs to take over.
"""

from __future__ import annotations

from typing import Any

import psycopg
import structlog

from eventstore.sqlfile import load_queries

log = structlog.get_logger(__name__)
Q = load_queries("eventstore")


def end_frozen_sessions(conn: psycopg.Connection[Any], older_than: float) -> int:
    """End worker sessions waiting on their frozen client in a transaction for over `older_than` seconds;
    returns how many were ended."""
    ended = conn.execute(Q["end_frozen_sessions"], {"seconds": older_than}).fetchall()
    for pid, application, _ in ended:
        log.warning("frozen_session_ended", pid=pid, application=application, after_seconds=older_than)
    return len(ended)

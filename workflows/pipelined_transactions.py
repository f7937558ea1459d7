"""A transaction on an autocommit connection whose statements travel together, BEGIN with the first and
COMMIT with the last sync. Apart from the queue's statements: a run's start and a node's end run theirs,
and their run-stream appends, inside it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from eventstore.spi import pipelined
from workflows.queries import Q

Conn = psycopg.Connection[Any]


@contextmanager
def pipelined_transaction(conn: Conn) -> Iterator[Conn]:
    """A transaction on an autocommit connection whose statements travel together: BEGIN goes with the
    first statements and COMMIT with the final sync, so a transaction that fetches one result midway costs
    two round trips. Whatever goes wrong inside (a driver error, or a check of the caller's that raises
    without the server knowing), nothing of it commits."""
    committed = False
    try:
        with pipelined(conn):
            conn.execute(Q["begin"])
            yield conn
            conn.execute(Q["commit"])
        committed = True
    finally:
        if not committed and not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            # On a broken connection the server rolls back by itself, and the pool discards it.
            with suppress(psycopg.Error):
                conn.execute(Q["rollback"])

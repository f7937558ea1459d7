"""Connections of a process's own, outside the pool, for callers above eventstore (a probe, token
lookups, a first check that the database answers), with driver errors translated as the pool's are."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from eventstore.db import connect, wrap_exceptions
from eventstore.errors import DatabaseUnavailableError


class OwnConnection:
    """One connection kept for work that must never wait behind the pool (a health probe, the API's
    token lookups): opened at its first use, and again at the use after it broke. Used from one thread
    at a time.

    `use()` is the database boundary for its user, as `EventStore.connection()` is: a driver error
    raised in the block, by the connection attempt or by a statement, comes out as a LedgerflowError;
    a DatabaseUnavailableError also closes the connection, so that the next use opens a fresh one."""

    def __init__(self, url: str, *, name: str, connect_timeout: int) -> None:
        self._url, self._name, self._connect_timeout = url, name, connect_timeout
        self._conn: psycopg.Connection[Any] | None = None

    @contextmanager
    def use(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection (autocommit), opened if need be."""
        try:
            with wrap_exceptions():
                if self._conn is None or self._conn.closed:
                    self._conn = connect(
                        self._url,
                        autocommit=True,
                        application_name=self._name,
                        connect_timeout=self._connect_timeout,
                    )
                yield self._conn
        except DatabaseUnavailableError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def try_connect(url: str, *, timeout: int) -> None:
    """One connection attempt, closed at once: raises DatabaseRefusedError or DatabaseUnavailableError
    with the driver's reason. Quicker to tell than the pool, which retries for its whole connect timeout
    and then only says that it timed out."""
    with wrap_exceptions():
        psycopg.connect(url, connect_timeout=timeout).close()

"""A connection of a process's own (eventstore.spi.OwnConnection), as the API's probe and token lookups
keep one: its driver errors come out translated, and after it broke the next use opens a fresh one."""

from __future__ import annotations

import psycopg
import pytest

from eventstore import DatabaseRefusedError, DatabaseUnavailableError, InvalidInputError
from eventstore.spi import OwnConnection, try_connect


def test_a_broken_connection_is_reported_typed_and_replaced_at_the_next_use(database_url: str) -> None:
    own = OwnConnection(database_url, name="own-connection-test", connect_timeout=5)
    try:
        with own.use() as conn:
            first = conn.info.backend_pid
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        with pytest.raises(DatabaseUnavailableError), own.use() as conn:
            conn.execute("SELECT 1")
        with own.use() as conn:
            assert conn.info.backend_pid != first
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        own.close()


def test_a_statement_refused_keeps_the_connection(database_url: str) -> None:
    own = OwnConnection(database_url, name="own-connection-test", connect_timeout=5)
    try:
        with own.use() as conn:
            pid = conn.info.backend_pid
        with pytest.raises(InvalidInputError), own.use() as conn:
            conn.execute("SELECT 1 / 0")
        with own.use() as conn:
            assert conn.info.backend_pid == pid
    finally:
        own.close()


def test_one_attempt_tells_a_refusal(database_url: str) -> None:
    missing = psycopg.conninfo.make_conninfo(database_url, dbname="no_such_database_here")
    with pytest.raises(DatabaseRefusedError) as refused:
        try_connect(missing, timeout=5)
    assert (refused.value.failure, refused.value.database) == ("no_database", "no_such_database_here")

"""`EventStore.connection()`: a pool connection for statements of the caller's own, with the database
boundary built in: a driver error raised in the block comes out as a LedgerflowError, its cause kept."""

from __future__ import annotations

import psycopg
import pytest

from eventstore import EventStore, InvalidInputError, LedgerflowError, MissingRelationError


def test_statements_run_on_it(store: EventStore) -> None:
    with store.connection() as conn:
        row = conn.execute("SELECT 41 + 1").fetchone()
    assert row == (42,)


def test_a_driver_error_in_the_block_comes_out_translated(store: EventStore) -> None:
    with pytest.raises(MissingRelationError) as raised, store.connection() as conn:
        conn.execute("SELECT * FROM ledgerflow.no_such_table")
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)
    with pytest.raises(InvalidInputError), store.connection() as conn:
        conn.execute("SELECT 1 / 0")


def test_the_connection_goes_back_usable_after_an_error(store: EventStore) -> None:
    with pytest.raises(LedgerflowError), store.connection() as conn, conn.transaction():
        conn.execute("SELECT * FROM ledgerflow.no_such_table")
    for _ in range(store.pool.max_size + 1):  # every connection of the pool answers again
        with store.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_other_errors_pass_unchanged(store: EventStore) -> None:
    with pytest.raises(KeyError), store.connection():
        raise KeyError("mine")

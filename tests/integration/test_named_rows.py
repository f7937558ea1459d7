"""Rows cross from SQL into Python by column name (eventstore.rows, eventstore.event_rows): a shape is
built from the columns whatever their order, and a column that does not fit fails where the row is read
instead of shifting a value into the wrong field. Only SELECTs of literals: they run on the server's own
database, with nothing to clone or clean up."""

from __future__ import annotations

import psycopg
import pytest

from eventstore import Cursor
from eventstore.spi import EventRow, checked_rows, fetch_all, fetch_one, fetch_value

_EVENT_COLUMNS = (
    "SELECT 7::bigint AS bytes, 5::bigint AS position, 9::bigint AS transaction_id, 't' AS tenant,"
    " 's-1' AS stream_id, 2::bigint AS stream_version, gen_random_uuid() AS event_id, 'Seen' AS event_type,"
    " '{}' AS data, '{}' AS metadata, NULL::uuid AS correlation_id, NULL::uuid AS causation_id,"
    " now() AS recorded_at"
)


def test_a_shape_is_built_by_the_names_of_the_columns_not_their_order(admin_url: str) -> None:
    with psycopg.connect(admin_url) as conn:
        one = fetch_one(conn, Cursor, "SELECT 2 AS position, 1 AS transaction_id")
        many = fetch_all(
            conn, Cursor, "SELECT 4 AS position, g AS transaction_id FROM generate_series(1, 2) g"
        )
    assert one == Cursor(transaction_id=1, position=2)
    assert many == [Cursor(1, 4), Cursor(2, 4)]


def test_a_column_the_shape_lacks_fails_where_the_row_is_read(admin_url: str) -> None:
    with psycopg.connect(admin_url) as conn, pytest.raises(TypeError, match="extra"):
        fetch_one(conn, Cursor, "SELECT 1 AS transaction_id, 2 AS position, 3 AS extra")


def test_a_value_is_none_without_a_row(admin_url: str) -> None:
    with psycopg.connect(admin_url) as conn:
        assert fetch_value(conn, "SELECT 1 WHERE false") is None
        assert fetch_value(conn, "SELECT 41 + 1") == 42


def test_a_read_whose_columns_match_its_shape_gives_plain_tuples_in_that_order(admin_url: str) -> None:
    with psycopg.connect(admin_url) as conn, conn.cursor(row_factory=checked_rows(EventRow)) as cur:
        row = cur.execute(_EVENT_COLUMNS).fetchone()
    assert type(row) is tuple
    named = EventRow._make(row)
    assert (named.bytes, named.position, named.transaction_id, named.stream_id) == (7, 5, 9, "s-1")


def test_a_read_whose_columns_moved_fails_before_any_row_is_taken(admin_url: str) -> None:
    swapped = _EVENT_COLUMNS.replace(
        "5::bigint AS position, 9::bigint AS transaction_id",
        "9::bigint AS transaction_id, 5::bigint AS position",
    )
    assert swapped != _EVENT_COLUMNS
    with (
        psycopg.connect(admin_url) as conn,
        conn.cursor(row_factory=checked_rows(EventRow)) as cur,
        pytest.raises(psycopg.ProgrammingError, match="EventRow"),
    ):
        cur.execute(swapped).fetchone()

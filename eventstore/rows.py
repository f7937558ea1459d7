"""Named rows out of a statement: its one value, one row or all rows, each row built by name.

A row crosses from SQL into Python by the names of its columns (psycopg's `kwargs_row`, of which its
`class_row` is a case), never by position: reordering a statement's columns, or adding one, then cannot
shift a value into the wrong field unseen, and a column the shape lacks fails at once, naming it. Each
fetch goes through `synced`, so they serve inside a `pipelined` block as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import sql
from psycopg.abc import Params
from psycopg.rows import RowFactory, kwargs_row, scalar_row

from eventstore.db import synced

T = TypeVar("T")
Query = LiteralString | bytes | sql.SQL | sql.Composed


def fetch_value(conn: psycopg.Connection[Any], query: Query, params: Params | None = None) -> Any:
    """The first column of the statement's first row, or None when it returns no row."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return synced(cur.execute(query, params)).fetchone()


def fetch_values(conn: psycopg.Connection[Any], query: Query, params: Params | None = None) -> list[Any]:
    """The first column of each of the statement's rows."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return synced(cur.execute(query, params)).fetchall()


def fetch_one(
    conn: psycopg.Connection[Any], shape: Callable[..., T], query: Query, params: Params | None = None
) -> T | None:
    """The statement's first row as `shape(**columns)`, or None without one. `shape` is a class whose
    fields are named as the columns (psycopg's `class_row`), or a function taking them by keyword."""
    with conn.cursor(row_factory=kwargs_row(shape)) as cur:
        return synced(cur.execute(query, params)).fetchone()


def fetch_all(
    conn: psycopg.Connection[Any], shape: Callable[..., T], query: Query, params: Params | None = None
) -> list[T]:
    """The statement's rows, each `shape(**columns)` (see `fetch_one`)."""
    with conn.cursor(row_factory=kwargs_row(shape)) as cur:
        return synced(cur.execute(query, params)).fetchall()


def sent(
    conn: psycopg.Connection[Any], rows: RowFactory[T], query: Query, params: Params | None = None
) -> psycopg.Cursor[T]:
    """The statement sent, its answer not awaited (in a `pipelined` block it travels with the next ones),
    each of its rows to be built by `rows` (`scalar_row`, or `kwargs_row` of a shape): fetch from the
    returned cursor through `synced`."""
    cur = conn.cursor(row_factory=rows)
    cur.execute(query, params)
    return cur

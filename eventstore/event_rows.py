"""The rows the log's reads answer, named: a stream read's (`EventRow`) and a read of the global log's
(`LogRow`). Both end with an event's columns in one order, so whatever takes an event from a row takes it
from either (see `reading._recorded`).

The reads return thousands of rows, so the shapes name the columns and check them against each
statement once (`checked_rows`), and the rows stay the plain tuples psycopg builds fastest.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import RowMaker


class EventRow(NamedTuple):
    """A row of a stream read (read_stream_forward, read_stream_backward, read_streams, read_stream_page
    in queries.sql)."""

    #: The page's running size with this event (read_stream_page); 0 in a whole read.
    bytes: int
    position: int
    transaction_id: int
    tenant: str
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    event_type: str
    #: JSON text as stored; the decoded dict once personal fields were revealed (`Shredder.reveal`).
    data: str
    metadata: str
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    recorded_at: datetime


class LogRow(NamedTuple):
    """A row of read_all (queries.sql): the page's horizon on every row, then an `EventRow`'s columns. A
    page without events is one row whose event columns are all None (typed as an event's: the reader
    looks at `position` and drops that row before anything takes an event from it)."""

    xmin: int
    #: Whether the transaction the horizon stopped at had ended by the time it was looked at.
    ended: bool
    bytes: int
    position: int
    transaction_id: int
    tenant: str
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    event_type: str
    data: str
    metadata: str
    correlation_id: uuid.UUID | None
    causation_id: uuid.UUID | None
    recorded_at: datetime


def checked_rows(shape: type[EventRow] | type[LogRow]) -> Callable[[psycopg.Cursor[Any]], RowMaker[Any]]:
    """A row factory for reads of `shape`: the statement's columns must be its fields, by name and in
    order, checked once per statement; the rows themselves are plain tuples in that order, which psycopg
    builds in C without a Python call per row (built as `shape`, the Python work of a read of 50,000
    events took about a third longer). Name a row as `shape._make(row)` where speed does not matter."""

    def factory(cursor: psycopg.Cursor[Any]) -> RowMaker[Any]:
        names = tuple(column.name for column in cursor.description or ())
        if names != shape._fields:
            raise psycopg.ProgrammingError(
                f"a read's columns {names} are not those of {shape.__name__}: {shape._fields}"
            )
        return tuple  # psycopg's fast path: the very type, as its `tuple_row` returns it

    return factory

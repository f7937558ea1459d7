"""The one-event append, sent through libpq directly on a thread's pinned connection.

psycopg's `execute` costs an append about a third of its client CPU (a cursor, the query and parameter
adaptation, result loaders), more than everything ledgerflow itself does. The append that nearly every
producer makes, one event to one stream, is one fixed statement with ten parameters of three types, so
it is prepared once per connection under a name of its own and executed with its parameters already in
PostgreSQL's binary form: text as its bytes (with their length, so no byte is lost), bigints as 8 bytes,
UUIDs as their 16 bytes. The statement text is the store's own (`append_one_event` in queries.sql), its
named placeholders numbered here; nothing else differs, and errors come back as the driver's errors, so
they are translated as always.

The GIL is released while libpq waits, as in psycopg. Only connections whose client encoding is UTF-8
take this path (the store's always do); others go through psycopg.
"""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_TEXT, _INT8, _UUID = 25, 20, 2950  # type OIDs
#: The append statements' parameters and their types.
PARAMETER_TYPES = {
    "tenant": _TEXT,
    "stream_id": _TEXT,
    "count": _INT8,
    "expected": _INT8,
    "event_id": _UUID,
    "type": _TEXT,
    "one_data": _TEXT,
    "one_metadata": _TEXT,
    "correlation_id": _UUID,
    "causation_id": _UUID,
}
_UNDEFINED_STATEMENT = "26000"
_BINARY = 1
_TEXT_RESULT = 0
_int8 = struct.Struct("!q").pack


@dataclass(frozen=True, slots=True)
class DirectStatement:
    """A statement of the store's, numbered for libpq: `$1` is `names[0]`."""

    name: bytes
    text: bytes
    names: tuple[str, ...]
    types: tuple[int, ...]

    @classmethod
    def of(cls, name: str, query: bytes) -> DirectStatement:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        text = _PLACEHOLDER.sub(number, query.decode())
        if "%" in text:
            raise ValueError(f"statement {name!r} holds a placeholder other than %(name)s")
        return cls(
            f"ledgerflow_{name}".encode(),
            text.encode(),
            tuple(names),
            tuple(PARAMETER_TYPES[n] for n in names),
        )

    def values(self, params: Mapping[str, Any]) -> list[bytes | None]:
        """The parameters in PostgreSQL's binary form, in the statement's order."""
        out: list[bytes | None] = []
        for name, oid in zip(self.names, self.types, strict=True):
            value = params[name]
            if value is None:
                out.append(None)
            elif oid == _TEXT:
                out.append(value.encode())
            elif oid == _INT8:
                out.append(_int8(value))
            else:
                out.append(value.bytes if isinstance(value, uuid.UUID) else uuid.UUID(str(value)).bytes)
        return out


def usable(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn` can take the direct path (its text travels as UTF-8)."""
    return conn.info.encoding == "utf-8"


def execute(
    conn: psycopg.Connection[Any], prepared: set[bytes], statement: DirectStatement, params: Mapping[str, Any]
) -> list[tuple[bytes | None, ...]]:
    """Run `statement` on `conn`, preparing it first if `prepared` (the names prepared on `conn`) lacks
    it; return its rows as text values. Raises the driver's error for whatever the server refuses."""
    pgconn = conn.pgconn
    # None is a NULL to libpq (psycopg passes it so too), though the stub's type leaves it out.
    values: Any = statement.values(params)
    formats = [_BINARY] * len(values)
    if statement.name not in prepared:
        _prepare(conn, statement)
        prepared.add(statement.name)
    result = pgconn.exec_prepared(statement.name, values, formats, _TEXT_RESULT)
    if result.status != pq.ExecStatus.TUPLES_OK:
        error = _error(conn, result)
        if error.sqlstate != _UNDEFINED_STATEMENT:
            raise error
        # The session lost it (DISCARD ALL, DEALLOCATE ALL): nothing ran; prepare it again.
        _prepare(conn, statement)
        result = pgconn.exec_prepared(statement.name, values, formats, _TEXT_RESULT)
        if result.status != pq.ExecStatus.TUPLES_OK:
            raise _error(conn, result)
    columns = range(result.nfields)
    return [tuple(result.get_value(row, c) for c in columns) for row in range(result.ntuples)]


def _prepare(conn: psycopg.Connection[Any], statement: DirectStatement) -> None:
    result = conn.pgconn.prepare(statement.name, statement.text, statement.types)
    if result.status != pq.ExecStatus.COMMAND_OK:
        error = _error(conn, result)
        if not isinstance(error, psycopg.errors.DuplicatePreparedStatement):
            raise error


def _error(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> psycopg.Error:
    """The driver's error for a failed result; a lost connection is an OperationalError, as in psycopg."""
    if conn.pgconn.status != pq.ConnStatus.OK:
        message = (conn.pgconn.error_message or b"").decode(errors="replace").strip()
        return psycopg.OperationalError(message or "the connection was lost")
    return psycopg.errors.error_from_result(result, encoding="utf-8")

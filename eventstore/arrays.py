"""Arrays that travel to PostgreSQL in binary, encoded once and cheaply.

The hot statements (appends, a node's end, a run's start, a claim) take their values as arrays: about
twenty-five per workflow run. psycopg adapts a plain list by looking at its elements to choose the
array's type, then dumps each element through a dumper of its own: in a profile of a worker, that was
a fifth of its CPU. These lists say their element type once, by their class, and are written in
PostgreSQL's binary array format in one pass (a header, then each element's length and bytes; -1 for
NULL).

Each is a `list`: where a statement takes it as text (`%(x)s`), psycopg's own list dumper serves. Only
the binary placeholder (`%(x)b`) uses the dumpers here, registered globally when this module is imported.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from psycopg import pq
from psycopg.adapt import Dumper

_header = struct.Struct("!iiiii").pack  # dimensions, has NULLs, element type, length, lower bound
_empty = struct.Struct("!iii").pack
_length = struct.Struct("!i").pack
_NULL = _length(-1)


def _text(value: Any) -> bytes:
    return value.encode()  # type: ignore[no-any-return]


def _uuid(value: Any) -> bytes:
    return value.bytes if isinstance(value, uuid.UUID) else uuid.UUID(str(value)).bytes


class _Array(list[Any]):
    element_oid: ClassVar[int]
    array_oid: ClassVar[int]
    #: One element (never None) in its type's binary form.
    element: ClassVar[Callable[[Any], bytes]]


class TextArray(_Array):
    """text[]: str elements, or None."""

    element_oid, array_oid, element = 25, 1009, _text


class IntArray(_Array):
    """int[] (int4): int elements, or None."""

    element_oid, array_oid, element = 23, 1007, struct.Struct("!i").pack


class BigintArray(_Array):
    """bigint[]: int elements, or None."""

    element_oid, array_oid, element = 20, 1016, struct.Struct("!q").pack


class FloatArray(_Array):
    """float8[]: float (or int) elements, or None."""

    element_oid, array_oid, element = 701, 1022, struct.Struct("!d").pack


class UuidArray(_Array):
    """uuid[]: UUID elements, or None."""

    element_oid, array_oid, element = 2950, 2951, _uuid


def encode(array: _Array) -> bytes:
    """`array` in PostgreSQL's binary array format (one dimension, lower bound 1)."""
    if not array:
        return _empty(0, 0, array.element_oid)
    element = type(array).element
    parts: list[bytes] = []
    has_null = 0
    for value in array:
        if value is None:
            has_null = 1
            parts.append(_NULL)
        else:
            data = element(value)
            parts.append(_length(len(data)))
            parts.append(data)
    return _header(1, has_null, array.element_oid, len(array), 1) + b"".join(parts)


def _dumper(cls: type[_Array]) -> type[Dumper]:
    class ArrayDumper(Dumper):
        format = pq.Format.BINARY
        oid = cls.array_oid

        def dump(self, obj: Any) -> bytes:
            return encode(obj)

    ArrayDumper.__name__ = f"{cls.__name__}Dumper"
    return ArrayDumper


for _cls in (TextArray, IntArray, BigintArray, FloatArray, UuidArray):
    psycopg.adapters.register_dumper(_cls, _dumper(_cls))

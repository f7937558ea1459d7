"""JSON text to Python values and back, without losing a digit of a number.

PostgreSQL's jsonb keeps numbers as exact decimals; Python's `json` turns every number with a fraction or an
exponent into a binary float, so `1.00000000000000000001` reads back as `1.0` and `1e-400` as `0.0`.
`loads` keeps a number as a float when the float has exactly the value written (`0.1`, `2.5`, `1e-07`, and
every float Python itself wrote), and as a `decimal.Decimal` otherwise. `dumps` writes a Decimal as a JSON
number with all its digits. So a value read and written again keeps its exact value, and floats a program
stored come back as the same floats.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

__all__ = ["dumps", "loads"]

_ENCODERS: dict[bool, Callable[[str], str]] = {
    False: json.encoder.encode_basestring,
    True: json.encoder.encode_basestring_ascii,
}


def _number(text: str) -> float | Decimal:
    value = float(text)
    if repr(value) == text:
        return value
    exact = Decimal(text)
    # The float is kept only when it is the written value exactly (e.g. "0.0000001" is the float 1e-07).
    if math.isfinite(value) and Decimal(repr(value)) == exact and (value != 0 or exact.is_zero()):
        return value
    return exact


# One decoder for every call: `json.loads` with options would build a new one each time.
_decoder = json.JSONDecoder(parse_float=_number)
_decode = _decoder.decode
# The decoder's C scanner: `decode` around it costs two regular-expression matches per call (leading and
# trailing whitespace), more than scanning a small event. Text the database or `dumps` wrote has no
# whitespace around its value; anything else goes through `decode`, which also raises the usual errors.
_scan: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]


def loads(text: str | bytes | bytearray | memoryview) -> Any:
    """Parse JSON text (str, or UTF-8 bytes) keeping every number's exact value."""
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8")
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return _decode(text)  # not a value at the start: whitespace first, or not JSON
    if end != len(text):
        return _decode(text)  # whitespace after the value, or more than one value
    return value


class _NeedsDecimal(Exception):
    pass


def _refuse(value: object) -> object:
    if isinstance(value, Decimal):
        raise _NeedsDecimal
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: One encoder per option set, built once: `json.dumps` with options builds a new encoder on every call,
#: which costs more than encoding a small event.
_FAST = {
    (sort_keys, ensure_ascii): json.JSONEncoder(
        ensure_ascii=ensure_ascii,
        allow_nan=False,
        separators=(",", ":"),
        sort_keys=sort_keys,
        default=_refuse,
    ).encode
    for sort_keys in (False, True)
    for ensure_ascii in (False, True)
}


def dumps(value: Any, *, sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """Compact JSON text (NaN and Infinity refused with ValueError; characters beyond ASCII escaped only
    with `ensure_ascii`); Decimals are written as numbers with all their digits."""
    try:
        # The common case, no Decimal anywhere: the C encoder at full speed.
        return _FAST[sort_keys, ensure_ascii](value)
    except _NeedsDecimal:
        parts: list[str] = []
        _write(value, parts, _ENCODERS[ensure_ascii], sort_keys, set())
        return "".join(parts)


def _key(key: object) -> str:
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int | float):
        return _scalar(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _scalar(value: int | float | Decimal) -> str:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is not a JSON number")
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
        return float.__repr__(value)
    return int.__repr__(value)


def _write(value: Any, out: list[str], encode: Callable[[str], str], sort_keys: bool, seen: set[int]) -> None:
    if isinstance(value, str):
        out.append(encode(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int | float | Decimal):
        out.append(_scalar(value))
    elif isinstance(value, Mapping | list | tuple):
        if id(value) in seen:
            raise ValueError("Circular reference detected")
        seen.add(id(value))
        if isinstance(value, Mapping):
            items = [(_key(k), v) for k, v in value.items()]
            if sort_keys:
                items.sort(key=lambda kv: kv[0])
            out.append("{")
            for i, (k, v) in enumerate(items):
                if i:
                    out.append(",")
                out.append(encode(k))
                out.append(":")
                _write(v, out, encode, sort_keys, seen)
            out.append("}")
        else:
            out.append("[")
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _write(item, out, encode, sort_keys, seen)
            out.append("]")
        seen.discard(id(value))
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

"""Input checks that run before anything reaches the database, so bad input never touches the log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from eventstore import jsonvalue
from eventstore.errors import EventTooLargeError, InvalidInputError

TENANT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
EVENT_TYPE_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]{0,199}$")
# Printable ASCII without spaces: keys travel in HTTP headers.
IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[!-~]{1,200}$")
MAX_STREAM_ID_LENGTH = 400
# A NUL escape in JSON text: \u0000 preceded by an even number of backslashes (an odd number means the
# backslash itself was escaped and the text is a literal "\u0000").
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not TENANT_PATTERN.match(tenant):
        raise InvalidInputError(
            f"tenant {tenant!r} is invalid: use 1-63 characters of a-z, 0-9, '_' and '-', starting with a "
            "letter or digit"
        )
    return tenant


def check_stream_id(stream_id: str) -> str:
    if not isinstance(stream_id, str) or not stream_id.strip():
        raise InvalidInputError("stream id is empty: name the stream, e.g. 'order-42'")
    if len(stream_id) > MAX_STREAM_ID_LENGTH:
        raise InvalidInputError(
            f"stream id is {len(stream_id)} characters long; the limit is {MAX_STREAM_ID_LENGTH}"
        )
    if not stream_id.isprintable():
        raise InvalidInputError(f"stream id {stream_id!r} contains control characters")
    return stream_id


def check_event_type(event_type: str) -> str:
    if not isinstance(event_type, str) or not EVENT_TYPE_PATTERN.match(event_type):
        raise InvalidInputError(
            f"event type {event_type!r} is invalid: start with a letter, then up to 199 of letters, digits "
            "and '_ . : / -'"
        )
    return event_type


def check_idempotency_key(key: str) -> str:
    if not isinstance(key, str) or not IDEMPOTENCY_KEY_PATTERN.match(key):
        raise InvalidInputError(
            "idempotency key is invalid: use 1-200 printable ASCII characters without spaces, e.g. a UUID"
        )
    return key


def dump_json_object(value: Mapping[str, Any], what: str) -> str:
    """Serialise a JSON object the way PostgreSQL's jsonb will accept it, or raise InvalidInputError."""
    text, problem = dumped_json_object(value)
    if problem is not None:
        raise InvalidInputError(f"{what} {problem}")
    return text


def dumped_json_object(value: Mapping[str, Any]) -> tuple[str, str | None]:
    """`value` as the JSON text jsonb will accept, or what is wrong with it (then the text is empty).

    The hot path of every append: the message naming the value is only built by the caller, on failure.
    """
    if not isinstance(value, Mapping):
        return "", f"must be a JSON object (a mapping), not {type(value).__name__}"
    try:
        # NaN and Infinity are not JSON and jsonb refuses them; Decimals keep all their digits.
        text = jsonvalue.dumps(value)
        if not text.isascii():
            # Lone surrogates cannot be encoded to UTF-8 and PostgreSQL cannot store them. (ASCII text,
            # the common case, is known to encode: `isascii` is a flag of the string, not a scan.)
            text.encode("utf-8")
    except (TypeError, ValueError) as exc:
        return "", f"is not valid JSON: {exc}"
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        return "", "contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
    return text, None


def utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def check_size(event_type: str, data_text: str, metadata_text: str, limit: int) -> None:
    size = utf8_length(data_text) + utf8_length(metadata_text)
    if size > limit:
        raise EventTooLargeError(
            f"event {event_type!r} is {size} bytes serialised; the limit is {limit} "
            "(LEDGERFLOW_MAX_EVENT_BYTES). Store large payloads elsewhere and append a reference."
        )

"""The checks every part of a workflow definition shares, and the error they raise: names, lists that
must not be a bare string, configs that must be plain JSON. Apart so that nodes, limits and workflows
check alike; pure, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

from eventstore import InvalidInputError

# Names end up in event payloads, log fields and metric labels, so they are kept to one safe alphabet.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


class DefinitionError(InvalidInputError):
    """A workflow definition is malformed; nothing was registered."""

    code = "invalid_definition"


def check_name(kind: str, name: object) -> None:
    # fullmatch, not `$`: `$` also matches before a trailing newline.
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise DefinitionError(
            f"invalid {kind} name {name!r}: use 1 to 63 characters of a-z, 0-9 and _, starting with a letter"
        )


def as_names(where: str, value: Iterable[str]) -> tuple[str, ...]:
    # A bare string is iterable too, and would silently become one dependency per character.
    if isinstance(value, str):
        raise DefinitionError(f"{where}: depends_on must be a list of node names, not the string {value!r}")
    return tuple(value)


def json_problem(value: object, path: str) -> str | None:
    """Where `value` stops being plain JSON, or None. Stricter than `json.dumps`, which silently turns
    int keys into strings and writes NaN, which PostgreSQL's jsonb refuses."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}"
    if isinstance(value, list | tuple):
        return next((p for i, v in enumerate(value) if (p := json_problem(v, f"{path}[{i}]"))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the non-string key {key!r}"
            if problem := json_problem(item, f"{path}[{key!r}]"):
                return problem
        return None
    return f"{path} is a {type(value).__name__}"


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def limit_names(where: str, value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise DefinitionError(f"{where}: limits must be a list of limit names, not the string {value!r}")
    names = tuple(value)
    for name in names:
        check_name("limit", name)
    if len(set(names)) != len(names):
        raise DefinitionError(f"{where} lists a limit more than once: {list(names)}")
    return names

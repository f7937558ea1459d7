"""Upcasters: functions that bring a stored event's data from one version of its type to the next.

An upcaster takes and returns either a dict (the event's JSON data) or pydantic models: when its first
parameter is annotated with a model class, the data is validated into that model first, and a model it
returns is dumped to JSON data. A chain 1->2->3 runs its steps in order; each step's result is the next
step's input. Nothing here reads or writes the log: the stored events never change.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

#: The metadata key that records the version of an event's data: set at append for declared types; on
#: read, the version of the shape returned. Events appended before their type was declared have none
#: and count as version 1.
VERSION_KEY = "$schema_version"
#: On an event read in a later shape than it was stored in: the version it was stored at.
UPCAST_FROM_KEY = "$upcast_from"

UpcasterFunction = Callable[[Any], Any]


class StepFailed(Exception):
    """Raised by `Upcaster.apply`; the registry turns it into an UpcastError naming the event."""


@dataclass(frozen=True, slots=True)
class Upcaster:
    """One step of a type's chain: `from_version` -> `to_version` (= from_version + 1)."""

    event_type: str
    from_version: int
    to_version: int
    function: UpcasterFunction
    #: The model the function takes, when it takes a model rather than a dict.
    takes: type[pydantic.BaseModel] | None

    @classmethod
    def of(cls, event_type: str, from_version: int, to_version: int, fn: UpcasterFunction) -> Upcaster:
        return cls(event_type, from_version, to_version, fn, _model_parameter(fn))

    @property
    def name(self) -> str:
        return f"{getattr(self.function, '__module__', '?')}.{getattr(self.function, '__qualname__', '?')}"

    def apply(self, data: Mapping[str, Any]) -> dict[str, Any]:
        try:
            given: Any = self.takes.model_validate(data) if self.takes is not None else dict(data)
            result = self.function(given)
        except Exception as exc:
            raise StepFailed(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(result, pydantic.BaseModel):
            return result.model_dump(mode="json")
        if not isinstance(result, dict):
            raise StepFailed(f"it returned a {type(result).__name__}, not a dict or a model")
        return result


def _model_parameter(fn: UpcasterFunction) -> type[pydantic.BaseModel] | None:
    """The model class the function's first parameter is annotated with, if it is one."""
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return None
    if first is None:
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: treat the function as dict -> dict
        return None
    hint = hints.get(first.name)
    if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
        return hint
    return None

"""Event types declared as pydantic models: validated on append and on read.

Types that are not declared still append and read as raw envelopes (`RecordedEvent`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pydantic

from eventstore._validation import check_event_type
from eventstore.errors import EventDecodeError, InvalidInputError
from eventstore.events import NewEvent, RecordedEvent
from eventstore.personal import declare_model

M = TypeVar("M", bound=type[pydantic.BaseModel])


class EventTypes:
    """A registry of event type names and their models."""

    def __init__(self) -> None:
        self._models: dict[str, type[pydantic.BaseModel]] = {}
        self._names: dict[type[pydantic.BaseModel], str] = {}

    def register(self, name: str, model: type[pydantic.BaseModel]) -> None:
        check_event_type(name)
        if self._models.get(name, model) is not model:
            raise InvalidInputError(f"event type {name!r} is already declared with another model")
        declare_model(name, model)  # its `Personal(...)` fields, sealed at append (eventstore.personal)
        self._models[name] = model
        self._names[model] = name

    def event(self, name: str) -> Callable[[M], M]:
        """Class decorator: `@types.event("OrderPlaced") class OrderPlaced(BaseModel): ...`."""

        def decorate(model: M) -> M:
            self.register(name, model)
            return model

        return decorate

    def name_of(self, model: type[pydantic.BaseModel]) -> str:
        try:
            return self._names[model]
        except KeyError:
            raise InvalidInputError(
                f"{model.__name__} is not a declared event type; register it first"
            ) from None

    def new(self, payload: pydantic.BaseModel, **envelope: Any) -> NewEvent:
        """A NewEvent for a model instance; `envelope` takes metadata, event_id, correlation/causation ids."""
        return NewEvent(type=self.name_of(type(payload)), data=payload.model_dump(mode="json"), **envelope)

    def validate(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Raise InvalidInputError if `data` does not fit the model declared for `event_type`."""
        model = self._models.get(event_type)
        if model is None:
            return
        try:
            model.model_validate(data)
        except pydantic.ValidationError as exc:
            raise InvalidInputError(
                f"event {event_type!r} does not match its declared model: {exc}"
            ) from None

    def decode(self, event: RecordedEvent) -> pydantic.BaseModel | RecordedEvent:
        """The model instance for a declared type, or the raw envelope for any other type."""
        model = self._models.get(event.type)
        if model is None:
            return event
        try:
            return model.model_validate(event.data)
        except pydantic.ValidationError as exc:
            raise EventDecodeError(
                f"stored event at position {event.position} ({event.type!r}) "
                f"no longer matches its model: {exc}"
            ) from exc

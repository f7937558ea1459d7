"""Event types declared as pydantic models with a version, and upcasters between versions.

Declared types are validated on append, which records their version in the event's metadata
(`$schema_version`); reads return every event of a declared type in its latest shape, through the
upcasters registered from each older version. Types that are not declared append and read as raw
envelopes (`RecordedEvent`), as they always did.

    @event_type("OrderPlaced", version=2)
    class OrderPlaced(BaseModel): ...

    @upcaster("OrderPlaced", 1, 2)
    def _(data: dict) -> dict: ...

The module-level decorators register in `DEFAULT_TYPES`, the registry a store uses unless given another.
A registry is checked (every step of every chain present) when a store opens with it and again before
its next use after any registration: a missing step is an EventTypeRegistryError then, never a surprise
on the one old event that needs it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pydantic

from eventstore import jsonvalue
from eventstore._validation import check_event_type
from eventstore.errors import EventDecodeError, EventTypeRegistryError, InvalidInputError, UpcastError
from eventstore.events import EncodedEvent, NewEvent, RecordedEvent
from eventstore.personal import declare_model
from eventstore.upcasting import UPCAST_FROM_KEY, VERSION_KEY, StepFailed, Upcaster, UpcasterFunction

M = TypeVar("M", bound=type[pydantic.BaseModel])
F = TypeVar("F", bound=UpcasterFunction)


@dataclass(frozen=True, slots=True)
class TypeDeclaration:
    """What the registry holds for one event type, for listings (`ledgerflow events types`)."""

    name: str
    latest: int
    #: Declared model per version.
    models: Mapping[int, type[pydantic.BaseModel]]
    upcasters: tuple[Upcaster, ...]


class EventTypes:
    """A registry of event types: per type name, a model per version and upcasters between them."""

    def __init__(self) -> None:
        self._models: dict[str, dict[int, type[pydantic.BaseModel]]] = {}
        self._names: dict[type[pydantic.BaseModel], tuple[str, int]] = {}
        self._upcasters: dict[str, dict[int, Upcaster]] = {}
        #: Latest version per declared type (the highest of its models and its upcasters' targets).
        self._latest: dict[str, int] = {}
        #: Latest version per type with upcasters, as of the last check (see `may_upcast`).
        self._upcast_to: dict[str, int] = {}
        self._checked = True
        self._lock = threading.Lock()

    # -- declaring ---------------------------------------------------------------------------------

    def register(self, name: str, model: type[pydantic.BaseModel], version: int = 1) -> None:
        check_event_type(name)
        _check_version(version, f"the version of {name!r}")
        with self._lock:
            if self._names.get(model, (name, version)) != (name, version):
                known, known_version = self._names[model]
                raise EventTypeRegistryError(
                    f"{model.__name__} is already declared as {known!r} version {known_version}; "
                    "declare one model per type and version"
                )
            versions = self._models.setdefault(name, {})
            if versions.get(version, model) is not model:
                raise EventTypeRegistryError(
                    f"event type {name!r} version {version} is already declared with another model"
                )
            versions[version] = model
            self._names[model] = (name, version)
            self._latest[name] = max(self._latest.get(name, 0), version)
            if self._latest[name] == version:
                # Its `Personal(...)` fields are sealed at append (eventstore.personal): an append is
                # recorded in the latest shape, so the latest version's model says which fields are personal.
                declare_model(name, model)
            self._checked = False

    def event(self, name: str, version: int = 1) -> Callable[[M], M]:
        """Class decorator: `@types.event("OrderPlaced", version=2) class OrderPlaced(BaseModel): ...`."""

        def decorate(model: M) -> M:
            self.register(name, model, version)
            return model

        return decorate

    event_type = event

    def add_upcaster(self, name: str, from_version: int, to_version: int, fn: UpcasterFunction) -> None:
        check_event_type(name)
        _check_version(from_version, f"the upcaster's source version of {name!r}")
        if to_version != from_version + 1:
            raise EventTypeRegistryError(
                f"upcaster {name!r} {from_version}->{to_version}: an upcaster goes one version up "
                f"({from_version}->{from_version + 1}); chain several for a longer way"
            )
        with self._lock:
            steps = self._upcasters.setdefault(name, {})
            if from_version in steps:
                raise EventTypeRegistryError(
                    f"event type {name!r} already has an upcaster {from_version}->{to_version}"
                )
            steps[from_version] = Upcaster.of(name, from_version, to_version, fn)
            self._latest[name] = max(self._latest.get(name, 0), to_version)
            self._checked = False

    def upcaster(self, name: str, from_version: int, to_version: int) -> Callable[[F], F]:
        """Function decorator: `@types.upcaster("OrderPlaced", 1, 2) def _(data: dict) -> dict: ...`."""

        def decorate(fn: F) -> F:
            self.add_upcaster(name, from_version, to_version, fn)
            return fn

        return decorate

    def check(self) -> None:
        """Raise EventTypeRegistryError if some declared type lacks a step from version 1 to its latest
        version, or its latest version has no model. Events stored before a type was declared count as
        version 1, so every chain starts there."""
        with self._lock:
            problems = []
            for name, latest in sorted(self._latest.items()):
                steps = self._upcasters.get(name, {})
                missing = [f"{v}->{v + 1}" for v in range(1, latest) if v not in steps]
                if missing:
                    problems.append(f"{name!r} lacks upcaster {', '.join(missing)}")
                if latest not in self._models.get(name, {}):
                    problems.append(f"{name!r} has upcasters to version {latest} but no model for it")
            self._upcast_to = {name: self._latest[name] for name, steps in self._upcasters.items() if steps}
            if problems:
                raise EventTypeRegistryError(
                    "event types do not fit together: "
                    + "; ".join(problems)
                    + ". Register the missing upcasters (@upcaster(type, from, from + 1)) and models."
                )
            self._checked = True

    def _ensure_checked(self) -> None:
        if not self._checked:
            self.check()

    # -- looking up --------------------------------------------------------------------------------

    def declarations(self) -> list[TypeDeclaration]:
        """Every declared type, by name."""
        with self._lock:
            return [
                TypeDeclaration(
                    name,
                    latest,
                    dict(sorted(self._models.get(name, {}).items())),
                    tuple(u for _, u in sorted(self._upcasters.get(name, {}).items())),
                )
                for name, latest in sorted(self._latest.items())
            ]

    def latest_version(self, name: str) -> int | None:
        return self._latest.get(name)

    def name_of(self, model: type[pydantic.BaseModel]) -> str:
        return self._declared(model)[0]

    def _declared(self, model: type[pydantic.BaseModel]) -> tuple[str, int]:
        try:
            return self._names[model]
        except KeyError:
            raise InvalidInputError(
                f"{model.__name__} is not a declared event type; declare it first "
                "(@event_type(name, version=...))"
            ) from None

    # -- appending ---------------------------------------------------------------------------------

    def new(self, payload: pydantic.BaseModel, **envelope: Any) -> NewEvent:
        """A NewEvent for a model instance, recording its type's version; `envelope` takes metadata,
        event_id, correlation/causation ids."""
        name, version = self._declared(type(payload))
        metadata = {**envelope.pop("metadata", {}), VERSION_KEY: version}
        return NewEvent(type=name, data=payload.model_dump(mode="json"), metadata=metadata, **envelope)

    def stamp(self, event: Any) -> Any:
        """What an append stores for `event`: a model instance becomes its NewEvent; a NewEvent of a
        declared type is validated against its version's model (the latest unless its metadata names
        one) and gets that version recorded. Anything else is returned as it is, for the store to judge."""
        if isinstance(event, pydantic.BaseModel):
            self._ensure_checked()
            return self.new(event)
        if not isinstance(event, NewEvent):
            return event
        stated = event.metadata.get(VERSION_KEY) if event.metadata else None
        if stated is not None:
            _check_version(stated, f"{VERSION_KEY} of event {event.type!r}")
        latest = self._latest.get(event.type)
        if latest is None:
            return event
        self._ensure_checked()
        version = latest if stated is None else stated
        if version > latest:
            raise InvalidInputError(
                f"event {event.type!r} states version {version}, but the latest declared is {latest}; "
                "declare the new version first"
            )
        model = self._models.get(event.type, {}).get(version)
        if model is not None:
            try:
                model.model_validate(event.data)
            except pydantic.ValidationError as exc:
                raise InvalidInputError(
                    f"event {event.type!r} does not match its declared model (version {version}): {exc}"
                ) from None
        if stated is not None:
            return event
        return dataclasses.replace(event, metadata={**event.metadata, VERSION_KEY: version})

    def validate(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Raise InvalidInputError if `data` does not fit the latest model declared for `event_type`."""
        self.stamp(NewEvent(event_type, data))

    # -- reading -----------------------------------------------------------------------------------

    def upcast(self, event: RecordedEvent) -> RecordedEvent:
        """`event` in its type's latest shape: itself when it is stored so (or its type has no chain);
        else a copy whose data went through each upcaster in turn and fits the latest model, and whose
        metadata says which version it is now and which it was stored at."""
        parts = self.latest_parts(event.type, event.data, event.metadata, lambda: event)
        return event if parts is None else _with_parts(event, *parts)

    def may_upcast(self, event_type: str, metadata: Mapping[str, Any]) -> bool:
        """False when `latest_parts` would certainly answer None (a type without upcasters, or an event
        stored in its latest version), decided without building anything: a read asks this of every event
        and calls `latest_parts` only for the others. Before the registry is checked, always True, so that
        the check runs as `latest_parts` runs it."""
        if not self._checked:
            return True
        latest = self._upcast_to.get(event_type)
        return latest is not None and metadata.get(VERSION_KEY, 1) != latest

    def latest_parts(
        self,
        event_type: str,
        data: Mapping[str, Any],
        metadata: Mapping[str, Any],
        event: Callable[[], RecordedEvent],
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """`upcast` on an event's decoded data and metadata, for a read that has not built the event yet
        (so that an upcast event is built once, not once as stored and again as upcast): None when the
        event is in its latest shape, else the latest shape's (data, metadata). `event` builds the event
        as stored, only for an error to name it."""
        steps = self._upcasters.get(event_type)
        if not steps:
            return None
        self._ensure_checked()
        latest = self._latest[event_type]
        stored = metadata.get(VERSION_KEY, 1)
        if stored == latest:
            return None
        if isinstance(stored, bool) or not isinstance(stored, int) or not 1 <= stored < latest:
            raise _upcast_error(
                event(),
                stored,
                None,
                f"its version is not one of 1 to {latest}; declare that version of the type",
            )
        for version in range(stored, latest):
            try:
                data = steps[version].apply(data)
            except StepFailed as exc:
                raise _upcast_error(event(), stored, (version, version + 1), str(exc)) from exc.__cause__
        model = self._models.get(event_type, {}).get(latest)
        if model is not None:
            try:
                model.model_validate(data)
            except pydantic.ValidationError as exc:
                raise _upcast_error(event(), stored, None, f"the result does not fit it: {exc}") from None
        return dict(data), {**metadata, VERSION_KEY: latest, UPCAST_FROM_KEY: stored}

    def upcast_encoded(self, event: EncodedEvent) -> EncodedEvent:
        """`upcast` for an event kept as JSON text: decoded and encoded again only when it changes."""
        if not self._upcasters.get(event.type):
            return event
        decoded = event.decode()
        shaped = self.upcast(decoded)
        if shaped is decoded:
            return event
        return dataclasses.replace(
            event, data_json=jsonvalue.dumps(shaped.data), metadata_json=jsonvalue.dumps(shaped.metadata)
        )

    def decode(self, event: RecordedEvent) -> pydantic.BaseModel | RecordedEvent:
        """The latest model's instance for a declared type, or the raw envelope for any other type."""
        versions = self._models.get(event.type)
        if not versions:
            return event
        event = self.upcast(event)
        model = versions.get(self._latest[event.type])
        if model is None:
            return event
        try:
            return model.model_validate(event.data)
        except pydantic.ValidationError as exc:
            raise EventDecodeError(
                f"stored event at position {event.position} ({event.type!r}) "
                f"no longer matches its model: {exc}"
            ) from exc


def _check_version(version: object, what: str) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= 32767:
        raise InvalidInputError(f"{what} is {version!r}: use a whole number from 1 to 32767")


def _with_parts(event: RecordedEvent, data: dict[str, Any], metadata: dict[str, Any]) -> RecordedEvent:
    """`event` with other data and metadata. Built field by field: dataclasses.replace looks each field up
    by name, which costs more than the upcaster and the validation together."""
    return RecordedEvent(
        event.position,
        event.transaction_id,
        event.tenant,
        event.stream_id,
        event.stream_version,
        event.event_id,
        event.type,
        data,
        metadata,
        event.correlation_id,
        event.causation_id,
        event.recorded_at,
    )


def _upcast_error(
    event: RecordedEvent, stored: Any, step: tuple[int, int] | None, reason: str
) -> UpcastError:
    return UpcastError(
        event_id=event.event_id,
        position=event.position,
        event_type=event.type,
        version=stored if isinstance(stored, int) else -1,
        step=step,
        reason=reason,
    )


#: The registry the module-level decorators fill, and the one a store uses unless given another.
DEFAULT_TYPES = EventTypes()


def event_type(name: str, version: int = 1) -> Callable[[M], M]:
    """Declare a pydantic model as version `version` of event type `name` (in `DEFAULT_TYPES`)."""
    return DEFAULT_TYPES.event(name, version)


def upcaster(name: str, from_version: int, to_version: int) -> Callable[[F], F]:
    """Register a function bringing `name` events from `from_version` to `to_version` (= from + 1), in
    `DEFAULT_TYPES`. It takes and returns a dict, or the two versions' models."""
    return DEFAULT_TYPES.upcaster(name, from_version, to_version)

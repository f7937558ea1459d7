"""Versioned event types and upcasters: the registry's checks and the chain, without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from eventstore import (
    UPCAST_FROM_KEY,
    VERSION_KEY,
    EventTypeRegistryError,
    EventTypes,
    InvalidInputError,
    NewEvent,
    RecordedEvent,
    UpcastError,
)


class PlacedV1(BaseModel):
    total: int


class PlacedV2(BaseModel):
    amount_cents: int
    currency: str


class PlacedV3(BaseModel):
    amount_cents: int
    currency: str
    channel: str


class Other(BaseModel):
    pass


def three_versions() -> EventTypes:
    types = EventTypes()
    types.register("OrderPlaced", PlacedV1, 1)
    types.register("OrderPlaced", PlacedV2, 2)
    types.register("OrderPlaced", PlacedV3, 3)

    @types.upcaster("OrderPlaced", 1, 2)
    def _(data: dict[str, Any]) -> dict[str, Any]:
        return {"amount_cents": data["total"] * 100, "currency": "EUR"}

    @types.upcaster("OrderPlaced", 2, 3)
    def _two(old: PlacedV2) -> PlacedV3:  # a model -> model upcaster
        return PlacedV3(amount_cents=old.amount_cents, currency=old.currency, channel="web")

    return types


def recorded(type_: str, data: dict[str, Any], metadata: dict[str, Any] | None = None) -> RecordedEvent:
    return RecordedEvent(
        position=7,
        transaction_id=1,
        tenant="default",
        stream_id="order-1",
        stream_version=1,
        event_id=uuid.UUID(int=7),
        type=type_,
        data=data,
        metadata=metadata or {},
        correlation_id=None,
        causation_id=None,
        recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_a_chain_applies_its_steps_in_order() -> None:
    types = three_versions()
    types.check()
    old = recorded("OrderPlaced", {"total": 3}, {VERSION_KEY: 1, "who": "ann"})
    new = types.upcast(old)
    assert new.data == {"amount_cents": 300, "currency": "EUR", "channel": "web"}
    assert new.metadata == {VERSION_KEY: 3, UPCAST_FROM_KEY: 1, "who": "ann"}
    assert old.data == {"total": 3}  # the event read is not changed
    middle = types.upcast(recorded("OrderPlaced", {"amount_cents": 5, "currency": "USD"}, {VERSION_KEY: 2}))
    assert middle.data == {"amount_cents": 5, "currency": "USD", "channel": "web"}


def test_an_event_without_a_version_counts_as_version_one() -> None:
    types = three_versions()
    assert types.upcast(recorded("OrderPlaced", {"total": 1})).data["amount_cents"] == 100


def test_latest_and_undeclared_events_come_back_as_they_are() -> None:
    types = three_versions()
    latest = recorded("OrderPlaced", {"amount_cents": 1, "currency": "EUR", "channel": "x"}, {VERSION_KEY: 3})
    assert types.upcast(latest) is latest
    other = recorded("Other", {"a": 1})
    assert types.upcast(other) is other


def test_a_missing_step_is_refused_when_checked_not_when_read() -> None:
    types = EventTypes()
    types.register("OrderPlaced", PlacedV1, 1)
    types.register("OrderPlaced", PlacedV3, 3)
    types.add_upcaster("OrderPlaced", 1, 2, lambda d: d)
    with pytest.raises(EventTypeRegistryError, match=r"'OrderPlaced' lacks upcaster 2->3"):
        types.check()
    # Any use before the chain is whole is refused the same way, whatever the event.
    with pytest.raises(EventTypeRegistryError):
        types.upcast(recorded("OrderPlaced", {"amount_cents": 1, "currency": "E", "channel": "w"}))
    types.add_upcaster("OrderPlaced", 2, 3, lambda d: {**d, "channel": "web"})
    types.check()


def test_an_upcaster_to_a_version_without_model_is_refused() -> None:
    types = EventTypes()
    types.register("OrderPlaced", PlacedV1, 1)
    types.add_upcaster("OrderPlaced", 1, 2, lambda d: d)
    with pytest.raises(EventTypeRegistryError, match="no model for it"):
        types.check()


def test_declarations_that_clash_are_refused() -> None:
    types = three_versions()
    with pytest.raises(EventTypeRegistryError, match="already declared with another model"):
        types.register("OrderPlaced", Other, 1)
    with pytest.raises(EventTypeRegistryError, match="already declared as 'OrderPlaced' version 3"):
        types.register("OrderPlaced", PlacedV3, 1)
    with pytest.raises(EventTypeRegistryError, match="already has an upcaster"):
        types.add_upcaster("OrderPlaced", 1, 2, lambda d: d)
    with pytest.raises(EventTypeRegistryError, match="one version up"):
        types.add_upcaster("OrderPlaced", 1, 3, lambda d: d)
    with pytest.raises(InvalidInputError, match="whole number"):
        types.register("Other", PlacedV1, 0)


def test_a_failing_upcaster_names_the_event_its_type_and_version() -> None:
    types = EventTypes()
    types.register("OrderPlaced", PlacedV2, 2)
    types.add_upcaster("OrderPlaced", 1, 2, lambda d: {"amount_cents": d["total"] * 100, "currency": "EUR"})
    with pytest.raises(UpcastError) as raised:
        types.upcast(recorded("OrderPlaced", {"price": 3}))
    error = raised.value
    assert error.details() == {
        "event_id": str(uuid.UUID(int=7)),
        "position": 7,
        "event_type": "OrderPlaced",
        "version": 1,
        "step": [1, 2],
    }
    assert "position 7" in str(error)
    assert "KeyError" in str(error)
    assert isinstance(error.__cause__, KeyError)


def test_an_upcast_that_does_not_fit_the_latest_model_is_refused() -> None:
    types = EventTypes()
    types.register("OrderPlaced", PlacedV2, 2)
    types.add_upcaster("OrderPlaced", 1, 2, lambda d: {"amount_cents": "lots"})
    with pytest.raises(UpcastError, match="the latest model"):
        types.upcast(recorded("OrderPlaced", {"total": 3}))


def test_a_stored_version_beyond_the_chain_is_refused() -> None:
    types = three_versions()
    with pytest.raises(UpcastError, match="not one of 1 to 3"):
        types.upcast(recorded("OrderPlaced", {"x": 1}, {VERSION_KEY: 9}))


def test_appends_record_the_version_and_validate_against_it() -> None:
    types = three_versions()
    stamped = types.stamp(PlacedV1(total=3))
    assert stamped.type == "OrderPlaced"
    assert stamped.metadata == {VERSION_KEY: 1}
    raw = types.stamp(NewEvent("OrderPlaced", {"amount_cents": 1, "currency": "E", "channel": "w"}))
    assert raw.metadata == {VERSION_KEY: 3}  # a raw event of a declared type is the latest version
    stated = NewEvent("OrderPlaced", {"total": 2}, metadata={VERSION_KEY: 1})
    assert types.stamp(stated) is stated
    with pytest.raises(InvalidInputError, match="version 3"):
        types.stamp(NewEvent("OrderPlaced", {"total": 2}))
    with pytest.raises(InvalidInputError, match="latest declared is 3"):
        types.stamp(NewEvent("OrderPlaced", {"total": 2}, metadata={VERSION_KEY: 4}))
    with pytest.raises(InvalidInputError, match="whole number"):
        types.stamp(NewEvent("Undeclared", {}, metadata={VERSION_KEY: "2"}))
    undeclared = NewEvent("Undeclared", {"a": 1})
    assert types.stamp(undeclared) is undeclared


def test_decode_gives_the_latest_model() -> None:
    types = three_versions()
    assert types.decode(recorded("OrderPlaced", {"total": 1})) == PlacedV3(
        amount_cents=100, currency="EUR", channel="web"
    )


def test_declarations_list_versions_and_upcasters() -> None:
    (placed,) = three_versions().declarations()
    assert placed.name == "OrderPlaced"
    assert placed.latest == 3
    assert list(placed.models) == [1, 2, 3]
    assert [(u.from_version, u.to_version, u.takes) for u in placed.upcasters] == [
        (1, 2, None),
        (2, 3, PlacedV2),
    ]

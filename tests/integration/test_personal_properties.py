"""Property: for any history of appends, retries and forgettings, no personal value of a forgotten subject
is readable from the log (decoded or encoded reads), and every other value is as appended."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings

from eventstore import (
    REDACTED,
    AppendResult,
    Cursor,
    DatabaseSettings,
    EventStore,
    NewEvent,
    forget_subject,
    generate_master_key,
    open_store,
    personal_fields,
)
from eventstore.spi import json_loads
from tests.strategies import shredding_moves

personal_fields("PropertyContact", subject="who", fields=["contact"])


@pytest.fixture
def shredding(database_url: str) -> Iterator[EventStore]:
    settings_ = DatabaseSettings(master_key=generate_master_key())  # type: ignore[arg-type]
    with open_store(settings_, url=database_url, migrate=False) as opened:
        yield opened


def _read_all(store: EventStore, tenant: str) -> list[Any]:
    found: list[Any] = []
    cursor = Cursor()
    while True:
        page = store.read_all_encoded(cursor, tenant=tenant)
        found.extend(page.events)
        cursor = page.cursor
        if page.caught_up:
            return found


@given(moves=shredding_moves)
@settings(max_examples=40, deadline=None)
def test_forgotten_values_are_never_readable(shredding: EventStore, moves: list[tuple[Any, ...]]) -> None:
    tenant = f"p{uuid.uuid4().hex[:12]}"  # each example in a tenant of its own
    appended: list[tuple[NewEvent, str, AppendResult]] = []
    forgotten: set[str] = set()
    for move in moves:
        if move[0] == "append":
            _, who, contact, n = move
            event = NewEvent("PropertyContact", {"who": who, "contact": contact, "n": n})
            key = f"k-{len(appended)}"
            appended.append(
                (event, key, shredding.append(f"c-{who}", [event], tenant=tenant, idempotency_key=key))
            )
        elif move[0] == "forget":
            forget_subject(shredding, move[1], tenant=tenant, by="property")
            forgotten.add(move[1])
        elif appended:
            event, key, first = appended[move[1] % len(appended)]
            again = shredding.append(f"c-{event.data['who']}", [event], tenant=tenant, idempotency_key=key)
            assert again.duplicate
            assert again.events == first.events
    events = {e.event_id: e for e in _read_all(shredding, tenant)}
    for event, _, result in appended:
        stored = events[event.event_id]
        assert (stored.stream_id, stored.stream_version, stored.position) == (
            result.events[0].stream_id,
            result.events[0].stream_version,
            result.events[0].position,
        )
        data = json_loads(stored.data_json)
        who = event.data["who"]
        assert (data["who"], data["n"]) == (who, event.data["n"])  # every other value unchanged
        assert data["contact"] == (REDACTED if who in forgotten else event.data["contact"])
        decoded = shredding.read_stream(stored.stream_id, tenant=tenant, from_version=stored.stream_version)[
            0
        ]
        assert decoded.data == data
    forgettings = [e for e in events.values() if e.type == "SubjectForgotten"]
    assert sorted(json_loads(e.data_json)["subject"] for e in forgettings) == sorted(forgotten)

"""A run's history entries (pure): attempts and workers carried from claims, across pages too; short
summaries for every payload, hostile ones included; tag bounds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore import RecordedEvent
from workflows import TagLimitError, TagLimits
from workflows import event_codec as codec
from workflows import events as ev
from workflows.history import entries, summary

RUN = uuid.uuid4()
AT = datetime(2026, 1, 1, tzinfo=UTC)


def recorded(at_version: int, event_type: str, **data: Any) -> RecordedEvent:
    return raw(at_version, event_type, data)


def raw(at_version: int, event_type: str, data: dict[str, Any]) -> RecordedEvent:
    return RecordedEvent(
        at_version, 1, "default", f"wf-{RUN}", at_version, uuid.uuid4(), event_type, data, {}, None, None, AT
    )


HISTORY = [
    recorded(1, ev.RUN_STARTED, workflow="wf", version="2", tags={"team": "red"}),
    recorded(2, ev.NODE_CLAIMED, node="a", attempt=1, token=1, worker="w1"),
    recorded(3, ev.NODE_PROGRESS, node="a", current=1, total=3, message="one"),
    recorded(4, ev.NODE_RETRY_SCHEDULED, node="a", attempt=1, error="boom", retry_in=0.5),
    recorded(5, ev.NODE_CLAIMED, node="a", attempt=2, token=2, worker="w2"),
    recorded(6, ev.NODE_SUCCEEDED, node="a", attempt=2, generation=2, duration_ms=12.4),
    recorded(7, ev.RUN_COMPLETED),
]


def test_attempts_and_workers_come_from_the_nodes_last_claim() -> None:
    got = [(e.type, e.node, e.attempt, e.worker) for e in entries(HISTORY)]
    assert got == [
        ("RunStarted", None, None, None),
        ("NodeClaimed", "a", 1, "w1"),
        ("NodeProgress", "a", 1, "w1"),
        ("NodeRetryScheduled", "a", 1, "w1"),
        ("NodeClaimed", "a", 2, "w2"),
        ("NodeSucceeded", "a", 2, "w2"),
        ("RunCompleted", None, None, None),
    ]
    summaries = [e.summary for e in entries(HISTORY)]
    assert summaries[0] == "wf v2, tags team=red"
    assert summaries[2] == "1/3 one"
    assert summaries[5] == "succeeded in 12 ms"


def test_a_reader_of_page_after_page_carries_the_claims() -> None:
    claims: dict[str, tuple[int, str]] = {}
    first, second = entries(HISTORY[:5], claims), entries(HISTORY[5:], claims)
    assert [(e.attempt, e.worker) for e in first + second] == [
        (e.attempt, e.worker) for e in entries(HISTORY)
    ]
    alone = entries(HISTORY[5:])
    assert (alone[0].attempt, alone[0].worker) == (2, None), "a page alone knows no earlier claim"


@given(
    event_type=st.sampled_from(sorted(codec.MODELS)) | st.text(max_size=20),
    # Nested a few levels and long strings, not wide: a summary's bound is met or broken by what one field
    # holds, and generating hundred-leaf trees took most of this test's time (0.2 s an example).
    data=st.dictionaries(
        st.text(max_size=10),
        st.recursive(st.none() | st.integers() | st.text(), st.lists, max_leaves=8),
        max_size=6,
    ),
)
def test_every_payload_gets_a_short_summary(event_type: str, data: dict[str, Any]) -> None:
    (entry,) = entries([raw(1, event_type, data)])
    assert len(entry.summary) <= 160
    assert isinstance(summary(event_type, data), str)


def test_tags_are_bounded() -> None:
    limits = TagLimits(max_tags_per_run=2, max_tag_key_chars=3, max_tag_value_chars=4)
    assert limits.check({"a": "1", "b": "22"}) == {"a": "1", "b": "22"}
    assert limits.check({"a": None}, removals=True) == {"a": None}
    for bad, setting in [
        ({"a": "1", "b": "2", "c": "3"}, "LEDGERFLOW_MAX_TAGS_PER_RUN"),
        ({"abcd": "1"}, "LEDGERFLOW_MAX_TAG_KEY_CHARS"),
        ({"a": "12345"}, "LEDGERFLOW_MAX_TAG_VALUE_CHARS"),
        ({"a": None}, None),
        ({"": "1"}, None),
        ({"a b": "1"}, None),
    ]:
        with pytest.raises(TagLimitError) as caught:
            limits.check(bad)
        assert caught.value.setting == setting
    with pytest.raises(TagLimitError):
        limits.merged({"a": "1", "b": "2"}, {"c": "3"})
    assert limits.merged({"a": "1", "b": "2"}, {"a": None, "c": "3"}) == {"b": "2", "c": "3"}

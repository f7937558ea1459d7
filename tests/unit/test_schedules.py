"""The ticks a schedule starts runs for, under each catch-up policy (pure: croniter and the clock given)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows import DefinitionError, Schedule, Trigger, Workflow
from workflows.schedules import due_ticks, idempotency_key, latest_tick, next_tick

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIVE = Schedule("*/5 * * * *", catch_up="all", max_catch_up=3)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def test_a_tick_is_due_from_its_exact_moment_on() -> None:
    assert latest_tick(FIVE.cron, T0) == T0
    assert latest_tick(FIVE.cron, T0 + minutes(4.9)) == T0
    assert next_tick(FIVE.cron, T0) == T0 + minutes(5)
    assert due_ticks(FIVE, T0, T0 + minutes(4.99)) == ([], 0)
    assert due_ticks(FIVE, T0, T0 + minutes(5)) == ([T0 + minutes(5)], 0)


def test_all_starts_the_latest_missed_ticks_up_to_its_cap_and_counts_the_rest() -> None:
    ticks, skipped = due_ticks(FIVE, T0, T0 + minutes(52))
    assert ticks == [T0 + minutes(40), T0 + minutes(45), T0 + minutes(50)]
    assert skipped == 7


def test_skip_starts_only_the_latest_missed_tick() -> None:
    skip = Schedule("*/5 * * * *", catch_up="skip")
    assert due_ticks(skip, T0, T0 + minutes(52)) == ([T0 + minutes(50)], 9)
    assert due_ticks(skip, T0 + minutes(50), T0 + minutes(52)) == ([], 0)


def test_a_long_downtime_costs_no_walk_over_every_missed_tick() -> None:
    every_second = Schedule("* * * * * *", catch_up="all", max_catch_up=5)
    began = time.monotonic()
    ticks, skipped = due_ticks(every_second, T0, T0 + timedelta(days=60))
    assert len(ticks) == 5
    assert skipped == 1000  # counted up to a bound
    # A walk over 60 days of seconds (5 million ticks) would take minutes; the bound allows for load.
    assert time.monotonic() - began < 10


@given(
    last=st.integers(min_value=0, max_value=10_000),
    ahead=st.integers(min_value=0, max_value=20_000),
    cap=st.integers(min_value=1, max_value=20),
    policy=st.sampled_from(["skip", "all"]),
)
def test_due_ticks_are_ordered_after_the_last_tick_and_end_at_the_latest(
    last: int, ahead: int, cap: int, policy: str
) -> None:
    schedule = Schedule("*/7 * * * * *", catch_up=policy, max_catch_up=cap)  # type: ignore[arg-type]
    last_tick = latest_tick(schedule.cron, T0 + timedelta(seconds=last))
    now = last_tick + timedelta(seconds=ahead, microseconds=123)
    ticks, skipped = due_ticks(schedule, last_tick, now)
    assert ticks == sorted(set(ticks))
    assert all(last_tick < t <= now for t in ticks)
    assert len(ticks) <= (1 if policy == "skip" else cap)
    if ticks:
        assert ticks[-1] == latest_tick(schedule.cron, now)
        assert all(next_tick(schedule.cron, a) == b for a, b in pairwise(ticks))
    else:
        assert latest_tick(schedule.cron, now) <= last_tick
        assert skipped == 0


def test_the_idempotency_key_names_the_workflow_and_the_tick_in_utc() -> None:
    assert idempotency_key("report", T0) == "schedule:report:2026-01-01T00:00:00+00:00"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Schedule("every day"), "invalid cron"),
        (lambda: Schedule("* * * * *", catch_up="some"), "catch_up"),  # type: ignore[arg-type]
        (lambda: Schedule("* * * * *", max_catch_up=0), "max_catch_up"),
        (lambda: Trigger(""), "event type"),
        (lambda: Trigger("OrderPlaced", category="order-1"), "category"),
        (lambda: Workflow("w", triggers=["OrderPlaced"]), "Trigger"),  # type: ignore[list-item]
        (lambda: Workflow("w", schedule="* * * * *"), "Schedule"),  # type: ignore[arg-type]
    ],
)
def test_bad_triggers_and_schedules_are_refused_when_declared(make: object, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        make()  # type: ignore[operator]

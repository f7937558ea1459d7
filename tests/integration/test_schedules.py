"""Schedules on a real PostgreSQL, with the clock given: one run per tick however many workers look at
once, missed ticks under each catch-up policy, and a tick whose start outlived its worker."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from eventstore import EventStore
from workflows import Engine, Schedule, Workflow, WorkflowRegistry, list_schedules
from workflows.schedules import ScheduleKeeper, idempotency_key, run_due_ticks, schedule_input

T0 = datetime(2026, 1, 1, tzinfo=UTC)

registry = WorkflowRegistry()
every_five = Workflow("every_five", schedule=Schedule("*/5 * * * *", catch_up="all", max_catch_up=3))
every_five_skip = Workflow("every_five_skip", schedule=Schedule("*/5 * * * *", catch_up="skip"))
for wf in (every_five, every_five_skip):
    wf.node(name="work")(lambda ctx: ctx.input)
    registry.register(wf)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def ticks_started(store: EventStore, workflow: str) -> list[str]:
    """The tick of each run of `workflow`, in the order they were started."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT data->'input'->>'tick' FROM ledgerflow.events "
            "WHERE event_type = 'wf.RunStarted' AND data->>'workflow' = %s ORDER BY position",
            (workflow,),
        ).fetchall()
    return [r[0] for r in rows]


def iso(at: datetime) -> str:
    return at.isoformat()


def test_a_new_schedule_starts_at_its_next_tick_and_each_tick_once(store: EventStore) -> None:
    engine = Engine(store, registry)
    assert run_due_ticks(engine, every_five, T0 + minutes(1)) == []  # first sight: no run for the past
    assert run_due_ticks(engine, every_five, T0 + minutes(4.9)) == []
    [started] = run_due_ticks(engine, every_five, T0 + minutes(5))
    assert started.created
    assert run_due_ticks(engine, every_five, T0 + minutes(6)) == []  # the same tick again: nothing
    assert ticks_started(store, "every_five") == [iso(T0 + minutes(5))]
    run = engine.load(started.run_id)
    assert run.input == {"tick": iso(T0 + minutes(5))}
    [row] = list_schedules(store)
    assert (row.workflow, row.last_tick, row.last_run_id, row.ticks_started) == (
        "every_five",
        T0 + minutes(5),
        started.run_id,
        1,
    )


def test_missed_ticks_follow_the_catch_up_policy(store: EventStore) -> None:
    engine = Engine(store, registry)
    for wf in (every_five, every_five_skip):
        run_due_ticks(engine, wf, T0)
    # Everything was down for 52 minutes: ten ticks passed.
    for wf in (every_five, every_five_skip):
        run_due_ticks(engine, wf, T0 + minutes(52))
    assert ticks_started(store, "every_five") == [iso(T0 + minutes(m)) for m in (40, 45, 50)]
    assert ticks_started(store, "every_five_skip") == [iso(T0 + minutes(50))]
    skipped = {row.workflow: row.ticks_skipped for row in list_schedules(store)}
    assert skipped == {"every_five": 7, "every_five_skip": 9}


def test_workers_looking_at_the_same_moment_start_each_tick_once(store: EventStore) -> None:
    engine = Engine(store, registry)
    run_due_ticks(engine, every_five, T0)
    for step in range(1, 6):
        now = T0 + minutes(5 * step)
        barrier = threading.Barrier(6, timeout=60)

        def look(at: datetime = now, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            run_due_ticks(engine, every_five, at)

        threads = [threading.Thread(target=look) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert ticks_started(store, "every_five") == [iso(T0 + minutes(5 * s)) for s in range(1, 6)]


def test_a_tick_started_by_a_worker_that_died_before_moving_the_schedule_is_not_started_again(
    store: EventStore,
) -> None:
    engine = Engine(store, registry)
    run_due_ticks(engine, every_five, T0)
    tick = T0 + minutes(5)
    # What a worker killed between the start's commit and its schedule's commit leaves behind.
    first = engine.start(
        "every_five", input=schedule_input(tick), idempotency_key=idempotency_key("every_five", tick)
    )
    [again] = run_due_ticks(engine, every_five, T0 + minutes(5))
    assert again.run_id == first.run_id
    assert not again.created
    assert ticks_started(store, "every_five") == [iso(tick)]


def test_the_keeper_starts_due_ticks_with_its_clock(store: EventStore) -> None:
    engine = Engine(store, registry)
    now = [T0]
    keeper = ScheduleKeeper(engine, registry, worker_id="k", clock=lambda: now[0])
    keeper.check()
    now[0] = T0 + minutes(10)
    keeper.check()
    assert ticks_started(store, "every_five") == [iso(T0 + minutes(5)), iso(T0 + minutes(10))]
    assert ticks_started(store, "every_five_skip") == [iso(T0 + minutes(10))]

"""Bulk operator actions: cancel, retry, pause and resume every run a filter keeps, recorded, bounded,
tenant-scoped and idempotent: a run is acted on once however often (or however concurrently) the action is
worked."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings

from eventstore import DatabaseSettings, EventStore, NotFoundError, open_store
from eventstore.pooling import bounded_waits
from tests.flows import registry
from tests.run_tables import project_runs
from tests.strategies import bulk_fleets
from tests.waiting import joined
from workflows import (
    BulkAction,
    BulkLimitError,
    Engine,
    RunFilter,
    bulk,
    bulk_action,
    bulk_kinds,
    create_bulk_action,
    plan_bulk,
    run_bulk_action,
    search_runs,
)
from workflows import events as ev


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def start(engine: Engine, batch: str, count: int, tenant: str = "default") -> list[uuid.UUID]:
    return [
        engine.start("linear", input=None, tags={"batch": batch}, tenant=tenant).run_id for _ in range(count)
    ]


def events_of(store: EventStore, run_id: uuid.UUID, kind: str, tenant: str = "default") -> int:
    return sum(1 for e in store.read_stream(ev.run_stream(run_id), tenant=tenant) if e.type == kind)


BATCH_A = RunFilter(tags=(("batch", "a"),))


def test_a_bulk_cancel_cancels_the_matching_runs_once_and_leaves_the_others(
    store: EventStore, engine: Engine
) -> None:
    chosen, others = start(engine, "a", 7), start(engine, "b", 4)
    project_runs(store)
    plan = plan_bulk(store, kind="cancel", tenant="default", filter=BATCH_A)
    assert (plan.matched, plan.over_limit) == (7, False)
    assert all(engine.load(r).active for r in chosen)  # a dry run touches nothing

    action = create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="test")
    seen: list[int] = []
    ended = run_bulk_action(engine, action.id, tenant="default", progress=lambda a: seen.append(a.done))
    assert (ended.state, ended.matched, ended.done, ended.failed, ended.skipped) == ("completed", 7, 7, 0, 0)
    oldest = search_runs(store, tenant="default", filter=BATCH_A, limit=7).runs[-1]["run_id"]
    assert ended.last_run_id == oldest
    assert seen
    assert seen[-1] == 7
    assert all(engine.load(r).status == "cancelled" for r in chosen)
    assert all(events_of(store, r, ev.RUN_CANCEL_REQUESTED) == 1 for r in chosen)
    assert all(engine.load(r).active for r in others)
    # Worked again, an ended action does nothing more.
    assert run_bulk_action(engine, action.id, tenant="default") == bulk_action(
        store, action.id, tenant="default"
    )
    assert all(events_of(store, r, ev.RUN_CANCEL_REQUESTED) == 1 for r in chosen)


def test_runs_started_after_the_action_was_recorded_are_not_its_business(
    store: EventStore, engine: Engine
) -> None:
    start(engine, "a", 3)
    project_runs(store)
    action = create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="test")
    later = start(engine, "a", 2)
    project_runs(store)
    ended = run_bulk_action(engine, action.id, tenant="default")
    assert (ended.matched, ended.done) == (3, 3)
    assert all(engine.load(r).active for r in later)


def test_two_actions_at_once_and_one_action_worked_twice_at_once_cancel_each_run_once(
    store: EventStore, engine: Engine
) -> None:
    chosen = start(engine, "a", 30)
    project_runs(store)
    errors: list[BaseException] = []
    shared = create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="test")

    def work(action_id: uuid.UUID | None) -> None:
        try:
            if action_id is None:
                own = create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="t")
                action_id = own.id
            run_bulk_action(engine, action_id, tenant="default")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(a,)) for a in (shared.id, shared.id, None, None)]
    for t in threads:
        t.start()
    joined(*threads)
    assert errors == []
    assert all(events_of(store, r, ev.RUN_CANCEL_REQUESTED) == 1 for r in chosen)
    assert all(engine.load(r).status == "cancelled" for r in chosen)
    run_bulk_action(engine, shared.id, tenant="default")  # whichever thread lost the lock: finish it
    final = bulk_action(store, shared.id, tenant="default")
    assert final.state == "completed"
    assert final.done + final.skipped == 30


def test_a_worker_that_finds_its_page_counted_by_another_leaves_the_action_to_it(
    store: EventStore, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The action's lock is held for a page's transaction only: between two pages of one worker, another
    # takes the action up and works the same pages.
    monkeypatch.setattr(bulk, "_PAGE", 5)
    chosen = start(engine, "a", 10)
    project_runs(store)
    action = create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="test")
    first_paused, first_go = threading.Event(), threading.Event()
    second_paused, second_go = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    returned: dict[str, BulkAction] = {}

    def hold(paused: threading.Event, go: threading.Event) -> Callable[[BulkAction], None]:
        def progress(_: BulkAction) -> None:
            if not paused.is_set():  # after its first page
                paused.set()
                assert go.wait(30)

        return progress

    def work(name: str, progress: Callable[[BulkAction], None]) -> None:
        try:
            returned[name] = run_bulk_action(engine, action.id, tenant="default", progress=progress)
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=work, args=("first", hold(first_paused, first_go)))
    first.start()
    assert first_paused.wait(30)
    second = threading.Thread(target=work, args=("second", hold(second_paused, second_go)))
    second.start()  # the first holds no lock between its pages: the second counts the second page
    assert second_paused.wait(30)
    first_go.set()  # the first works the second page too, is refused its count, and leaves
    joined(first)
    assert returned["first"].state == "running", errors
    second_go.set()
    joined(second)
    assert errors == []
    assert all(events_of(store, r, ev.RUN_CANCEL_REQUESTED) == 1 for r in chosen)
    final = bulk_action(store, action.id, tenant="default")
    assert (final.state, final.done, final.failed, final.skipped) == ("completed", 10, 0, 0)


@pytest.mark.parametrize("paged", [True, False], ids=["a page at a time", "one run at a time"])
def test_a_worker_that_finds_the_action_finished_by_another_returns_its_record(
    store: EventStore, engine: Engine, monkeypatch: pytest.MonkeyPatch, paged: bool
) -> None:
    # The first worker waits after its first page while a second works the rest and finishes the action:
    # the first's next page is refused its count, and it returns the finished record instead of raising.
    monkeypatch.setattr(bulk, "_PAGE", 5)
    if not paged:
        monkeypatch.setattr(bulk_kinds, "BATCHES", {})
    chosen = start(engine, "a", 10)
    project_runs(store)
    action = create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="test")
    paused, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    returned: dict[str, BulkAction] = {}

    def progress(_: BulkAction) -> None:
        if not paused.is_set():  # after its first page
            paused.set()
            assert go.wait(30)

    def first() -> None:
        try:
            returned["first"] = run_bulk_action(engine, action.id, tenant="default", progress=progress)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert paused.wait(30)
    second = run_bulk_action(engine, action.id, tenant="default")
    go.set()
    joined(thread)
    assert errors == []
    assert (second.state, second.done, second.failed, second.skipped) == ("completed", 10, 0, 0)
    assert returned["first"] == bulk_action(store, action.id, tenant="default")
    assert returned["first"].state == "completed"
    assert all(events_of(store, r, ev.RUN_CANCEL_REQUESTED) == 1 for r in chosen)


@pytest.mark.parametrize("paged", [True, False], ids=["a page at a time", "one run at a time"])
def test_a_bulk_action_needs_one_connection_at_a_time(
    database_url: str, paged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose pool has a single connection works an action to its end: the action's lock is
    taken in each page's (or run's) own transaction, not held on a connection beside the work's."""
    monkeypatch.setattr(bulk, "_PAGE", 3)
    if not paged:
        monkeypatch.setattr(bulk_kinds, "BATCHES", {})
    one_connection = DatabaseSettings(pool_min_size=1, pool_max_size=1)
    with open_store(one_connection, url=database_url, migrate=False) as one:
        scarce = Engine(one, registry)
        chosen = start(scarce, "a", 5)
        project_runs(one)
        action = create_bulk_action(one, kind="cancel", tenant="default", filter=BATCH_A, actor="test")
        # A checkout that waited for a second connection would give up here, not after the pool's 30 s.
        with bounded_waits(one.pool, 5.0):
            ended = run_bulk_action(scarce, action.id, tenant="default")
        assert (ended.state, ended.done, ended.failed, ended.skipped) == ("completed", 5, 0, 0)
        assert all(events_of(one, r, ev.RUN_CANCEL_REQUESTED) == 1 for r in chosen)


def test_a_bulk_retry_retries_each_run_once_even_when_resumed_after_acting_but_before_counting(
    store: EventStore, engine: Engine
) -> None:
    chosen = start(engine, "a", 5)
    for r in chosen:
        engine.cancel(r)
    project_runs(store)
    wanted = RunFilter(tags=(("batch", "a"),), statuses=("cancelled",))
    action = create_bulk_action(store, kind="retry", tenant="default", filter=wanted, actor="test")
    # A crash after the first run's retry committed and before its outcome was counted:
    newest = search_runs(store, tenant="default", filter=wanted, limit=1).runs[0]["run_id"]
    engine.retry(newest, idempotency_key=f"bulk:{action.id}:{newest}")
    ended = run_bulk_action(engine, action.id, tenant="default")
    assert (ended.done, ended.failed, ended.skipped) == (5, 0, 0)
    assert all(events_of(store, r, ev.RUN_RETRIED) == 1 for r in chosen)
    assert all(engine.load(r).status == "running" for r in chosen)
    # A retry repeated under its key writes and enqueues nothing.
    engine.retry(newest, idempotency_key=f"bulk:{action.id}:{newest}")
    assert events_of(store, newest, ev.RUN_RETRIED) == 1


def test_a_bulk_pause_then_a_bulk_resume_of_the_paused_runs_each_once(
    store: EventStore, engine: Engine
) -> None:
    chosen, others = start(engine, "a", 4), start(engine, "b", 2)
    engine.cancel(chosen[0])  # ended: no pause for it
    project_runs(store)
    paused = create_bulk_action(store, kind="pause", tenant="default", filter=BATCH_A, actor="test")
    # A crash after one run's pause committed and before its outcome was counted: met again, done once.
    engine.pause(chosen[1], actor=f"bulk:{paused.id}", idempotency_key=f"bulk:{paused.id}:{chosen[1]}")
    ended = run_bulk_action(engine, paused.id, tenant="default")
    assert (ended.done, ended.failed, ended.skipped) == (3, 0, 1)
    assert [events_of(store, r, ev.RUN_PAUSED) for r in chosen] == [0, 1, 1, 1]
    assert all(engine.load(r).paused for r in chosen[1:])
    assert not any(engine.load(r).paused for r in others)
    project_runs(store)
    wanted = RunFilter(tags=(("batch", "a"),), statuses=("paused",))
    assert plan_bulk(store, kind="resume", tenant="default", filter=wanted).matched == 3
    resumed = create_bulk_action(store, kind="resume", tenant="default", filter=wanted, actor="test")
    ended = run_bulk_action(engine, resumed.id, tenant="default")
    assert (ended.done, ended.failed, ended.skipped) == (3, 0, 0)
    assert [events_of(store, r, ev.RUN_RESUMED) for r in chosen] == [0, 1, 1, 1]
    assert all(engine.load(r).status == "running" for r in chosen[1:])
    # A pause repeated under its key does nothing, even though the run was resumed since.
    engine.pause(chosen[1], idempotency_key=f"bulk:{paused.id}:{chosen[1]}")
    assert not engine.load(chosen[1]).paused


def test_runs_that_do_not_allow_the_action_are_skipped(store: EventStore, engine: Engine) -> None:
    chosen = start(engine, "a", 3)
    project_runs(store)
    action = create_bulk_action(store, kind="retry", tenant="default", filter=BATCH_A, actor="test")
    ended = run_bulk_action(engine, action.id, tenant="default")
    assert (ended.done, ended.failed, ended.skipped) == (0, 0, 3)
    assert all(events_of(store, r, ev.RUN_RETRIED) == 0 for r in chosen)


def test_a_tenants_action_sees_and_touches_only_its_runs(store: EventStore, engine: Engine) -> None:
    mine, theirs = start(engine, "a", 3, tenant="acme"), start(engine, "a", 4, tenant="globex")
    project_runs(store)
    assert plan_bulk(store, kind="cancel", tenant="acme", filter=BATCH_A).matched == 3
    action = create_bulk_action(store, kind="cancel", tenant="acme", filter=BATCH_A, actor="test")
    with pytest.raises(NotFoundError, match="tenant"):
        bulk_action(store, action.id, tenant="globex")
    with pytest.raises(NotFoundError):
        run_bulk_action(engine, action.id, tenant="globex")
    assert bulk_action(store, action.id, tenant="acme").processed == 0
    ended = run_bulk_action(engine, action.id, tenant="acme")
    assert ended.done == 3
    assert all(engine.load(r, tenant="acme").status == "cancelled" for r in mine)
    assert all(engine.load(r, tenant="globex").active for r in theirs)


def test_more_matching_runs_than_the_limit_are_refused_and_nothing_is_recorded(
    store: EventStore, engine: Engine
) -> None:
    chosen = start(engine, "a", 5)
    project_runs(store)
    plan = plan_bulk(store, kind="cancel", tenant="default", filter=BATCH_A, limit=3)
    assert (plan.matched, plan.over_limit) == (4, True)
    with pytest.raises(BulkLimitError, match="LEDGERFLOW_BULK_MAX_RUNS") as caught:
        create_bulk_action(store, kind="cancel", tenant="default", filter=BATCH_A, actor="t", limit=3)
    assert caught.value.details()["limit"] == 3
    with store.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM ledgerflow.bulk_actions").fetchone() == (0,)
    assert all(engine.load(r).active for r in chosen)
    with pytest.raises(ValueError, match="unknown bulk action"):
        plan_bulk(store, kind="explode", tenant="default", filter=BATCH_A)


@settings(max_examples=15, deadline=None)
@given(bulk_fleets())
def test_a_bulk_action_touches_exactly_the_runs_its_filter_selects(
    store: EventStore, engine: Engine, fleet: tuple[list[tuple[str, str, bool]], Any, str]
) -> None:
    runs, (team, env, running_only), kind = fleet
    event_type = {"cancel": ev.RUN_CANCEL_REQUESTED, "pause": ev.RUN_PAUSED}[kind]
    tenant = f"t{uuid.uuid4().hex[:12]}"  # each example in a tenant of its own
    started = []
    for run_team, run_env, cancelled in runs:
        run_id = engine.start(
            "linear", input=None, tags={"team": run_team, "env": run_env}, tenant=tenant
        ).run_id
        if cancelled:
            engine.cancel(run_id, tenant=tenant)
        started.append((run_id, run_team, run_env, cancelled))
    project_runs(store)
    tags = tuple((k, v) for k, v in (("team", team), ("env", env)) if v is not None)
    wanted = RunFilter(tags=tags, statuses=("running",) if running_only else ())
    action = create_bulk_action(store, kind=kind, tenant=tenant, filter=wanted, actor="property")
    ended = run_bulk_action(engine, action.id, tenant=tenant)
    selected = {
        r
        for r, t, e, cancelled in started
        if team in (None, t) and env in (None, e) and not (running_only and cancelled)
    }
    assert ended.matched == ended.processed == len(selected)
    for run_id, _, _, cancelled in started:
        by_action = [
            e
            for e in store.read_stream(ev.run_stream(run_id), tenant=tenant)
            if e.type in (ev.RUN_CANCEL_REQUESTED, ev.RUN_PAUSED)
            and e.data.get("actor") == f"bulk:{action.id}"
        ]
        assert all(e.type == event_type for e in by_action)
        # A run the filter keeps that was cancelled before is skipped, not acted on.
        assert len(by_action) == (1 if run_id in selected and not cancelled else 0)
    assert ended.skipped == sum(1 for r, *_, c in started if r in selected and c)

"""Retention: ended runs older than their workflow's retention leave the run tables, through an event of
their own stream, so a rebuild leaves them out too; a released run is found by id and restored equal to
what it was. Nothing younger than its retention, and nothing still going, is ever released."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import DatabaseSettings, EventStore, InvalidInputError, open_store
from eventstore.pooling import bounded_waits
from projector import verify
from tests.run_tables import project_runs
from workflows import (
    Engine,
    NodeContext,
    RetentionSettings,
    RunStateError,
    Workflow,
    WorkflowRegistry,
    parse_duration,
    release_of,
    release_run,
    restore_run,
    retention_pass,
    search_runs,
    workflow_tables,
)
from workflows import events as ev
from workflows.children import children_projection
from workflows.testing import running_worker, wait_for_run

registry = WorkflowRegistry()
brief = Workflow("brief", retention=timedelta(microseconds=1))
long_kept = Workflow("long", retention=timedelta(hours=1))
kept = Workflow("kept")  # no retention of its own: the setting's, for ever by default
hold = Workflow("hold")


@brief.node()
def answer(ctx: NodeContext) -> Any:
    if ctx.input == "fail":
        raise ValueError("asked to fail")
    if ctx.input == "spawn":
        return str(ctx.start_workflow("brief", input="child"))
    return ctx.input


@long_kept.node()
def long_answer(ctx: NodeContext) -> Any:
    return ctx.input


@kept.node()
def kept_answer(ctx: NodeContext) -> Any:
    if ctx.input == "fail":
        raise ValueError("asked to fail")
    return ctx.input


@hold.node()
def held(ctx: NodeContext) -> Any:
    return ctx.wait_for_signal("go")


for wf in (brief, long_kept, kept, hold):
    registry.register(wf)

NEVER = RetentionSettings(run_retention=None)


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def rows_of(store: EventStore, run_id: uuid.UUID) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the run tables hold about the run."""
    queries = {
        "runs": "SELECT * FROM ledgerflow.workflow_runs WHERE run_id = %s",
        "nodes": "SELECT * FROM ledgerflow.workflow_nodes WHERE run_id = %s ORDER BY node",
        "tags": "SELECT * FROM ledgerflow.workflow_run_tags WHERE run_id = %s ORDER BY key",
        "children": "SELECT * FROM ledgerflow.workflow_children WHERE %s IN (parent_run_id, child_run_id)",
    }
    with store.pool.connection() as conn:
        return {name: conn.execute(q, (run_id,)).fetchall() for name, q in queries.items()}  # type: ignore[arg-type]


def count(store: EventStore, run_id: uuid.UUID, kind: str) -> int:
    return sum(1 for e in store.read_stream(ev.run_stream(run_id)) if e.type == kind)


def test_a_pass_releases_due_runs_only_a_rebuild_leaves_them_out_and_a_restore_brings_them_back(
    engine: Engine, store: EventStore
) -> None:
    with running_worker(engine, registry):
        done = engine.start("brief", input="ok", tags={"team": "red"}).run_id
        failed = engine.start("brief", input="fail").run_id
        parent = engine.start("brief", input="spawn").run_id
        young = engine.start("long", input="young").run_id
        forever = engine.start("kept", input="forever").run_id
        for run_id in (done, failed, parent, young, forever):
            wait_for_run(engine, run_id)
        child = uuid.UUID(engine.load(parent).nodes["answer"].output)
        wait_for_run(engine, child)
        waiting = engine.start("hold").run_id  # still going: its node waits for a signal
    project_runs(engine.store, children_projection(engine))
    due = [done, failed, parent, child]
    before = {run_id: rows_of(store, run_id) for run_id in due}
    assert before[done]["tags"], "the run has a tag row"
    assert before[child]["children"], "the child is linked to its parent"
    assert engine.load(failed).status == "failed"

    actions = retention_pass(engine, settings=NEVER)
    assert [(a.kind, a.state, a.done, a.failed) for a in actions] == [("release", "completed", 4, 0)]
    project_runs(engine.store, children_projection(engine))

    for run_id in due:
        assert rows_of(store, run_id) == {"runs": [], "nodes": [], "tags": [], "children": []}
        release = release_of(store, run_id)
        assert release is not None
        assert release.actor == f"bulk:{actions[0].id}"
        assert engine.load(run_id).workflow == "brief", "its stream is still there, found by id"
    for run_id in (young, forever, waiting):
        assert release_of(store, run_id) is None
        assert rows_of(store, run_id)["runs"], "younger, kept for ever, or still going: untouched"
    listed = {r["run_id"] for r in search_runs(store, tenant="default", limit=50).runs}
    assert listed == {young, forever, waiting}

    # The tables equal their rebuild: the rebuild brings back no released run.
    assert verify(store, workflow_tables).equal

    # A second pass finds nothing more to do, and releases no run twice.
    assert retention_pass(engine, settings=NEVER) == []
    assert all(count(store, run_id, ev.RUN_RELEASED) == 1 for run_id in due)

    # A released run is not retried unseen: it is restored first.
    with pytest.raises(RunStateError, match="restore it first"):
        engine.retry(failed)

    for run_id in due:
        restore_run(engine, run_id)
    project_runs(engine.store, children_projection(engine))
    assert {run_id: rows_of(store, run_id) for run_id in due} == before
    assert all(release_of(store, run_id) is None for run_id in due)
    assert verify(store, workflow_tables).equal
    with pytest.raises(RunStateError, match="not released"):
        restore_run(engine, done)


def test_a_pass_respects_the_setting_and_another_tenant_is_untouched(
    engine: Engine, store: EventStore
) -> None:
    with running_worker(engine, registry):
        mine = engine.start("kept", input="a").run_id
        theirs = engine.start("kept", input="b", tenant="acme").run_id
        wait_for_run(engine, mine)
        wait_for_run(engine, theirs, tenant="acme")
    project_runs(engine.store, children_projection(engine))
    assert retention_pass(engine, settings=NEVER) == [], "kept for ever by default"
    a_day = RetentionSettings(run_retention=timedelta(days=1))
    assert retention_pass(engine, settings=a_day) == [], "ended less than a day ago"
    soon = RetentionSettings(run_retention=timedelta(microseconds=1))
    (action,) = retention_pass(engine, settings=soon)
    assert (action.tenant, action.done) == ("default", 1)
    assert release_of(store, mine) is not None
    assert release_of(store, theirs, tenant="acme") is None


def test_a_pass_takes_at_most_its_batch_and_the_next_pass_takes_the_rest(
    engine: Engine, store: EventStore
) -> None:
    runs = [engine.start("hold").run_id for _ in range(5)]
    for run_id in runs:
        engine.cancel(run_id)  # nothing in flight: cancelled at once
    project_runs(engine.store, children_projection(engine))
    small = RetentionSettings(run_retention=timedelta(microseconds=1), retention_batch=3)
    (first,) = retention_pass(engine, settings=small)
    assert (first.matched, first.done) == (3, 3)
    (again,) = retention_pass(engine, settings=small)  # the tables have not caught up: found, not counted
    assert (again.matched, again.done, again.skipped) == (3, 0, 3)
    project_runs(engine.store, children_projection(engine))
    (second,) = retention_pass(engine, settings=small)
    assert (second.matched, second.done) == (2, 2)
    assert all(release_of(store, run_id) is not None for run_id in runs)


def test_a_pass_needs_one_connection_at_a_time(database_url: str) -> None:
    """A pass works its release actions as bulk actions do, a page on one connection: a process whose
    pool has a single connection passes to the end."""
    one_connection = DatabaseSettings(pool_min_size=1, pool_max_size=1)
    with open_store(one_connection, url=database_url, migrate=False) as one:
        scarce = Engine(one, registry)
        runs = [scarce.start("hold").run_id for _ in range(3)]
        for run_id in runs:
            scarce.cancel(run_id)
        project_runs(one, children_projection(scarce))
        soon = RetentionSettings(run_retention=timedelta(microseconds=1))
        # A checkout that waited for a second connection would give up here, not after the pool's 30 s.
        with bounded_waits(one.pool, 5.0):
            (action,) = retention_pass(scarce, settings=soon)
        assert (action.state, action.done) == ("completed", 3)
        assert all(release_of(one, run_id) is not None for run_id in runs)


# -- nothing younger, nothing going -----------------------------------------------------------------------

STATUSES = ("succeeded", "failed", "cancelled", "running")


def run_with(engine: Engine, status: str) -> uuid.UUID:
    if status == "running":
        return engine.start("hold").run_id
    if status == "cancelled":
        run_id = engine.start("hold").run_id
        engine.cancel(run_id)
        return run_id
    with running_worker(engine, registry):
        run_id = engine.start("kept", input="fail" if status == "failed" else "ok").run_id
        wait_for_run(engine, run_id)
    return run_id


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=st.sampled_from(STATUSES),
    age=st.integers(min_value=-(10**6), max_value=10**6),
    retention=st.integers(min_value=1, max_value=10**6),
)
def test_a_run_is_released_only_once_ended_for_at_least_its_retention(
    engine: Engine, store: EventStore, status: str, age: int, retention: int
) -> None:
    run_id = run_with(engine, status)
    run = engine.load(run_id)
    assert run.status == status
    now = (run.finished_at or datetime.now(UTC)) + timedelta(seconds=age)
    due = status != "running" and age >= retention
    try:
        release_run(engine, run_id, default=timedelta(seconds=retention), now=now)
    except RunStateError:
        assert not due
    else:
        assert due
    assert (release_of(store, run_id) is not None) == due


def test_durations_are_read_as_written_and_bad_ones_are_refused() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("P2D") == timedelta(days=2)
    assert parse_duration("90") == timedelta(seconds=90)
    assert parse_duration("forever") is None
    for bad in ("soon", "0s", "-5d"):
        with pytest.raises(InvalidInputError):
            parse_duration(bad)


# -- concurrency ------------------------------------------------------------------------------------------


def test_two_passes_at_once_release_each_run_exactly_once(engine: Engine, store: EventStore) -> None:
    runs = [engine.start("hold").run_id for _ in range(30)]
    for run_id in runs:
        engine.cancel(run_id)
    project_runs(engine.store, children_projection(engine))
    soon = RetentionSettings(run_retention=timedelta(microseconds=1))
    barrier = threading.Barrier(2)
    worked: list[list[Any]] = []

    def one_pass() -> None:
        barrier.wait()
        worked.append(retention_pass(engine, settings=soon))

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(worked) == 2, "both passes ended"
    assert sum(a.done for actions in worked for a in actions) == 30
    assert all(count(store, run_id, ev.RUN_RELEASED) == 1 for run_id in runs)


def race(engine: Engine, run_id: uuid.UUID) -> dict[str, str]:
    """A release and a retry of the run at once: what each answered."""
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def release() -> None:
        barrier.wait()
        try:
            release_run(engine, run_id, default=timedelta(microseconds=1))
            outcomes["release"] = "done"
        except RunStateError:
            outcomes["release"] = "refused"

    def retry() -> None:
        barrier.wait()
        try:
            engine.retry(run_id)
            outcomes["retry"] = "done"
        except RunStateError:
            outcomes["retry"] = "refused"

    threads = [threading.Thread(target=release), threading.Thread(target=retry)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_a_release_racing_a_retry_lets_exactly_one_of_them_happen(engine: Engine, store: EventStore) -> None:
    for _ in range(5):
        run_id = engine.start("hold").run_id
        engine.cancel(run_id)
        outcomes = race(engine, run_id)
        assert sorted(outcomes.values()) == ["done", "refused"], outcomes
        assert (release_of(store, run_id) is not None) == (outcomes["release"] == "done")
        assert engine.load(run_id).active == (outcomes["retry"] == "done")

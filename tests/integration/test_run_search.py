"""Runs carry tags (given at the start, set by nodes) and are found by every filter, a keyset page at a
time, in their own tenant only; bad tags and bad cursors are typed errors that write nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import EventStore, InvalidInputError
from projector import verify
from tests.run_tables import project_runs
from tests.waiting import wait_until
from tests.worker_threads import StartWorker, worker_threads
from workflows import (
    Engine,
    NodeContext,
    RetryPolicy,
    RunFilter,
    TagLimitError,
    Workflow,
    WorkflowRegistry,
    search_runs,
    tag_filter,
    workflow_tables,
)
from workflows import event_models as em

registry = WorkflowRegistry()
tagged = Workflow("tagged")


@tagged.node()
def label(ctx: NodeContext) -> Any:
    ctx.set_tags({"stage": "labelled", "drop": None, **(ctx.input or {}).get("set", {})})
    return None


@tagged.node(depends_on=["label"])
def spawn(ctx: NodeContext) -> Any:
    if (ctx.input or {}).get("child"):
        return str(ctx.start_workflow("plain", input=None))
    return None


registry.register(tagged)
plain = Workflow("plain")


@plain.node()
def only(ctx: NodeContext) -> Any:
    return 1


registry.register(plain)


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


@pytest.fixture
def start_worker(store: EventStore) -> Iterator[StartWorker]:
    with worker_threads(store, registry) as start:
        yield start


def ended(engine: Engine, run_id: uuid.UUID, tenant: str = "default") -> bool:
    return not engine.load(run_id, tenant=tenant).active


def ids(page: Any) -> list[uuid.UUID]:
    return [r["run_id"] for r in page.runs]


def test_tags_from_the_start_and_from_nodes_are_found(
    engine: Engine, store: EventStore, start_worker: StartWorker
) -> None:
    a = engine.start("tagged", tags={"team": "red", "drop": "x"}, input={"child": True}).run_id
    b = engine.start("tagged", tags={"team": "blue"}, input={"set": {"team": "red"}}).run_id
    c = engine.start("plain", tags={"team": "red"}).run_id
    start_worker()
    for run_id in (a, b, c):
        wait_until(lambda run_id=run_id: ended(engine, run_id), what="the runs to end")
    child = uuid.UUID(engine.load(a).nodes["spawn"].output)
    wait_until(lambda: ended(engine, child), what="the child to end")
    project_runs(store)

    assert engine.load(a).tags == {"team": "red", "stage": "labelled"}, "None removed `drop`"
    red = search_runs(store, tenant="default", filter=RunFilter(tags=tag_filter(["team=red"])))
    assert set(ids(red)) == {a, b, c}, "b's node changed its tag to red"
    assert {r["run_id"]: r["tags"] for r in red.runs}[a] == {"team": "red", "stage": "labelled"}
    both = RunFilter(tags=tag_filter(["team=red", "stage=labelled"]))
    assert set(ids(search_runs(store, tenant="default", filter=both))) == {a, b}
    assert set(ids(search_runs(store, tenant="default", filter=RunFilter(workflow="plain")))) == {c, child}
    assert ids(search_runs(store, tenant="default", filter=RunFilter(parent=a))) == [child]
    assert ids(search_runs(store, tenant="default", filter=RunFilter(version="2"))) == []
    assert len(ids(search_runs(store, tenant="default", filter=RunFilter(version="1")))) == 4
    assert len(search_runs(store, tenant="default", filter=RunFilter(statuses=("succeeded",))).runs) == 4
    assert search_runs(store, tenant="default", filter=RunFilter(statuses=("running",))).runs == []
    now = datetime.now(UTC)
    assert len(search_runs(store, tenant="default", filter=RunFilter(ended_before=now)).runs) == 4
    assert search_runs(store, tenant="default", filter=RunFilter(started_after=now)).runs == []
    an_hour_ago = RunFilter(started_after=now - timedelta(hours=1), ended_after=now - timedelta(hours=1))
    assert len(search_runs(store, tenant="default", filter=an_hour_ago).runs) == 4

    # Another tenant finds none of them, by any filter, nor by a cursor of this tenant's.
    assert search_runs(store, tenant="acme", filter=RunFilter(tags=tag_filter(["team=red"]))).runs == []
    assert search_runs(store, tenant="acme", filter=RunFilter(parent=a)).runs == []
    assert search_runs(store, tenant="acme").runs == []
    page = search_runs(store, tenant="default", limit=1)
    assert page.next is not None
    with pytest.raises(InvalidInputError, match="another search"):
        search_runs(store, tenant="acme", limit=1, after=page.next)

    # The tables, tag rows and parent links included, equal their rebuild.
    assert verify(store, workflow_tables).equal


def test_pages_follow_each_other_without_gaps_or_repeats(engine: Engine, store: EventStore) -> None:
    started = [engine.start("plain", tags={"batch": "b1"}).run_id for _ in range(23)]
    project_runs(store)
    for filter in (RunFilter(), RunFilter(tags=(("batch", "b1"),)), RunFilter(workflow="plain")):
        seen: list[uuid.UUID] = []
        after = None
        while True:
            page = search_runs(store, tenant="default", filter=filter, limit=5, after=after)
            seen += ids(page)
            if page.next is None:
                break
            after = page.next
        assert sorted(seen) == sorted(started)
        assert len(seen) == 23
        times = [r["created_at"] for r in search_runs(store, tenant="default", limit=23).runs]
        assert times == sorted(times, reverse=True)
    first = search_runs(store, tenant="default", limit=5)
    with pytest.raises(InvalidInputError, match="another search"):
        search_runs(store, tenant="default", filter=RunFilter(workflow="plain"), limit=5, after=first.next)
    with pytest.raises(InvalidInputError, match="invalid page cursor"):
        search_runs(store, tenant="default", after="not-a-cursor")


def test_a_run_found_by_its_triggering_event(engine: Engine, store: EventStore) -> None:
    trigger = em.TriggeringEvent(
        event_id=str(uuid.uuid4()), stream_id="order-1", type="Placed", transaction_id=1, position=1
    )
    run_id = engine.start("plain", triggered_by=trigger).run_id
    engine.start("plain")
    project_runs(store)
    found = search_runs(store, tenant="default", filter=RunFilter(triggered_by=trigger.event_id))
    assert ids(found) == [run_id]
    assert found.runs[0]["triggered_by"] == trigger.event_id


def writes(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("tags", "setting"),
    [
        ({f"k{i}": "v" for i in range(33)}, "LEDGERFLOW_MAX_TAGS_PER_RUN"),
        ({"k" * 65: "v"}, "LEDGERFLOW_MAX_TAG_KEY_CHARS"),
        ({"k": "v" * 257}, "LEDGERFLOW_MAX_TAG_VALUE_CHARS"),
        ({"bad key": "v"}, None),
        ({"k": 1}, None),
        ({"k": "line\nbreak"}, None),
    ],
)
def test_bad_tags_at_the_start_are_refused_and_write_nothing(
    engine: Engine, store: EventStore, tags: dict[str, Any], setting: str | None
) -> None:
    before = writes(store)
    with pytest.raises(TagLimitError) as caught:
        engine.start("plain", tags=tags)
    assert caught.value.setting == setting
    assert writes(store) == before


too_many = Workflow("too_many")


@too_many.node(retry=RetryPolicy(max_attempts=1))
def overflow(ctx: NodeContext) -> Any:
    ctx.set_tags({f"n{i}": "v" for i in range(20)})
    ctx.set_tags({f"m{i}": "v" for i in range(20)})  # 40 > 32: refused, the node fails


def test_a_node_setting_one_tag_too_many_fails_with_the_typed_error(
    store: EventStore, start_worker: StartWorker
) -> None:
    reg = WorkflowRegistry()
    reg.register(too_many)
    engine = Engine(store, reg)
    run_id = engine.start("too_many").run_id
    start_worker(registry=reg)
    wait_until(lambda: ended(engine, run_id), what="the run to fail")
    run = engine.load(run_id)
    assert run.status == "failed"
    assert "LEDGERFLOW_MAX_TAGS_PER_RUN" in (run.nodes["overflow"].error or "")
    assert len(run.tags) == 20


@given(
    runs=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"]), st.sampled_from(["t1", "t2"])),
        min_size=1,
        max_size=12,
    ),
    team=st.none() | st.sampled_from(["a", "b"]),
    env=st.none() | st.sampled_from(["x", "y"]),
    tenant=st.sampled_from(["t1", "t2"]),
    limit=st.integers(1, 4),
)
@settings(max_examples=15, deadline=None)
def test_a_search_pages_through_exactly_the_runs_its_filter_keeps(
    engine: Engine,
    store: EventStore,
    runs: list[tuple[str, str, str]],
    team: str | None,
    env: str | None,
    tenant: str,
    limit: int,
) -> None:
    marker = uuid.uuid4().hex  # the runs of earlier examples stay in the database
    started = {
        engine.start("plain", tags={"team": t, "env": e, "round": marker}, tenant=tn).run_id: (t, e, tn)
        for t, e, tn in runs
    }
    project_runs(store)
    wanted = [("round", marker)] + [(k, v) for k, v in (("team", team), ("env", env)) if v is not None]
    expected = {
        run_id
        for run_id, (t, e, tn) in started.items()
        if tn == tenant and team in (None, t) and env in (None, e)
    }
    seen: list[uuid.UUID] = []
    after = None
    while True:
        page = search_runs(
            store, tenant=tenant, filter=RunFilter(tags=tuple(wanted)), limit=limit, after=after
        )
        assert len(page.runs) <= limit
        seen += ids(page)
        if page.next is None:
            break
        after = page.next
    assert len(seen) == len(set(seen))
    assert set(seen) == expected


def test_concurrent_tag_setters_never_pass_the_bound(store: EventStore) -> None:
    """Two nodes of one run set tags at once: each checks the count against the run's tags as they are
    (a write at the version it read), so together they never pass LEDGERFLOW_MAX_TAGS_PER_RUN."""
    reg = WorkflowRegistry()
    wide = Workflow("wide")
    gate = threading.Barrier(2)
    outcomes: list[str] = []

    def setter(prefix: str) -> Any:
        def body(ctx: NodeContext) -> Any:
            gate.wait(timeout=30)
            try:
                ctx.set_tags({f"{prefix}{i}": "v" for i in range(20)})
                outcomes.append("set")
            except TagLimitError:
                outcomes.append("refused")

        return body

    wide.node(name="left")(setter("l"))
    wide.node(name="right")(setter("r"))
    reg.register(wide)
    engine = Engine(store, reg)
    run_id = engine.start("wide").run_id
    with worker_threads(store, reg) as start:
        start()
        wait_until(lambda: ended(engine, run_id), what="the run to end")
    assert sorted(outcomes) == ["refused", "set"]
    assert len(engine.load(run_id).tags) == 20

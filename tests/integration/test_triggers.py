"""Event-triggered starts with in-process workers on a real PostgreSQL: one run per matching event, the
event as input, its cursor recorded, in the event's tenant; never a second run for an event, whoever
applies it again."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventstore import Cursor, EventStore, NewEvent, RecordedEvent
from projector import ApplyContext, Projection, ProjectorWorker, cursor_rows
from projector import WorkerSettings as ProjectorSettings
from tests.integration.test_telemetry import metric_points, telemetry  # noqa: F401 (a fixture)
from tests.starts_flows import triggered
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker, triggers
from workflows.triggers import projection_name, trigger_projection, trigger_projections

TRIGGER = projection_name("on_order")


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, triggered)


def start_worker(engine: Engine, name: str) -> tuple[WorkflowWorker, threading.Thread]:
    w = WorkflowWorker(
        engine,
        triggered,
        WorkerSettings(concurrency=4, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2),
        name=name,
    )
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    return w, thread


@pytest.fixture
def worker(engine: Engine) -> Iterator[WorkflowWorker]:
    w, thread = start_worker(engine, "trigger-worker")
    yield w
    w.stop()
    thread.join(timeout=15)


def of_type(store: EventStore, event_type: str) -> list[RecordedEvent]:
    """Every event of this type in the log, in log order."""
    found: list[RecordedEvent] = []
    cursor = Cursor()
    while True:
        page = store.read_all(cursor, types=[event_type])
        found.extend(page.events)
        cursor = page.cursor
        if page.caught_up:
            return found


def started_runs(store: EventStore) -> list[tuple[str, dict[str, Any]]]:
    """(tenant, RunStarted payload) of every run started, in log order."""
    return [(e.tenant, dict(e.data)) for e in of_type(store, "wf.RunStarted")]


def completed(store: EventStore) -> int:
    return len(of_type(store, "wf.RunCompleted"))


def catch_up(store: EventStore, projection: Projection, worker_id: str | None = None) -> None:
    """Apply the trigger's projection up to now, in a consumer that hands its lease back at the end."""
    consumer = ProjectorWorker(store, [projection], ProjectorSettings(), worker_id=worker_id)
    try:
        consumer.run_until_caught_up()
    finally:
        consumer.release_all()


def order(total: int) -> NewEvent:
    return NewEvent("OrderPlaced", {"total": total})


def test_each_matching_event_starts_one_run_with_the_event_as_input(
    store: EventStore, engine: Engine, worker: WorkflowWorker
) -> None:
    placed = store.append("order-1", [order(30)])
    store.append("cart-1", [order(5)])  # another category
    store.append("order-1", [NewEvent("OrderPaid", {})])  # another type
    acme = store.append("order-2", [order(12)], tenant="acme")
    wait_until(lambda: completed(store) == 2, what="both triggered runs to complete")
    runs = started_runs(store)
    assert [tenant for tenant, _ in runs] == ["default", "acme"]  # each run in its event's tenant
    data = runs[0][1]
    event = placed.events[0]
    assert data["triggered_by"] == {
        "event_id": data["input"]["event_id"],
        "stream_id": "order-1",
        "type": "OrderPlaced",
        "transaction_id": event.transaction_id,
        "position": event.position,
    }
    assert data["input"]["data"] == {"total": 30}
    assert data["input"]["cursor"] == f"{event.transaction_id}:{event.position}"
    run = engine.load(uuid.UUID(str(data["run_id"])))
    assert run.triggered_by is not None
    assert run.triggered_by.position == event.position
    assert run.node("take_order").output["total"] == 30
    acme_run = engine.load(uuid.UUID(str(runs[1][1]["run_id"])), tenant="acme")
    assert acme_run.triggered_by is not None
    assert acme_run.triggered_by.position == acme.events[0].position
    with store.pool.connection() as conn:
        rows = conn.execute(f"SELECT tenant, run_id FROM ledgerflow.{TRIGGER} ORDER BY position").fetchall()
    assert [(t, str(r)) for t, r in rows] == [(t, d["run_id"]) for t, d in runs]


def test_events_appended_while_no_worker_ran_start_their_runs_when_one_starts(
    store: EventStore, engine: Engine
) -> None:
    for i in range(20):
        store.append(f"order-{i}", [order(i)])
    w, thread = start_worker(engine, "late-worker")
    try:
        wait_until(lambda: completed(store) == 20, what="20 runs to complete")
    finally:
        w.stop()
        thread.join(timeout=15)
    totals = sorted(d["input"]["data"]["total"] for _, d in started_runs(store))
    assert totals == list(range(20))


def test_an_event_applied_again_starts_no_second_run(store: EventStore, engine: Engine) -> None:
    """The idempotency key guards what the cursor cannot: the cursor moved back (a replay, or a crash
    between a start and its cursor's commit), and two appliers at once (a lease lost mid-batch)."""
    for i in range(10):
        store.append(f"order-{i}", [order(i)])
    projection = trigger_projection(engine, triggered.get("on_order"))
    catch_up(store, projection)
    assert len(started_runs(store)) == 10
    with store.pool.connection() as conn:
        cursor_rows.set_cursor(conn, TRIGGER, Cursor(), 1)  # back to the start of the log
    catch_up(store, projection)
    assert len(started_runs(store)) == 10

    for i in range(10, 20):
        store.append(f"order-{i}", [order(i)])
    events = of_type(store, "OrderPlaced")
    barrier = threading.Barrier(2, timeout=60)

    def apply_all() -> None:
        with store.pool.connection() as conn, conn.transaction():
            barrier.wait()
            projection.apply(ApplyContext(conn, projection.schema, projection.table_names), events)

    threads = [threading.Thread(target=apply_all) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    runs = started_runs(store)
    assert len(runs) == 20
    assert len({d["triggered_by"]["event_id"] for _, d in runs}) == 20


def test_trigger_projections_are_made_for_triggered_workflows_only(engine: Engine) -> None:
    from tests.flows import registry

    assert [p.name for p in trigger_projections(engine, triggered)] == [TRIGGER]
    assert trigger_projections(Engine(engine.store, registry), registry) == []
    long = projection_name("x" * 63)
    assert long.startswith("trigger_xxx")
    assert len(long) == 41


kinds = st.sampled_from([("order", "OrderPlaced"), ("cart", "OrderPlaced"), ("order", "OrderPaid")])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(appends=st.lists(st.tuples(kinds, st.sampled_from(["default", "acme"])), max_size=12))
def test_runs_started_are_exactly_the_matching_events(
    store: EventStore, engine: Engine, appends: list[tuple[tuple[str, str], str]]
) -> None:
    before = {(t, d["triggered_by"]["event_id"]) for t, d in started_runs(store)}
    expected = set()
    for (category, event_type), tenant in appends:
        result = store.append(f"{category}-{uuid.uuid4().hex[:8]}", [NewEvent(event_type, {})], tenant=tenant)
        if (category, event_type) == ("order", "OrderPlaced"):
            expected.add((tenant, str(result.events[0].position)))
    catch_up(store, trigger_projection(engine, triggered.get("on_order")))
    after = [(t, d) for t, d in started_runs(store) if (t, d["triggered_by"]["event_id"]) not in before]
    assert {(t, str(d["triggered_by"]["position"])) for t, d in after} == expected
    assert len(after) == len(expected)


def test_triggered_runs_are_counted_and_their_delay_measured(
    store: EventStore,
    engine: Engine,
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],  # noqa: F811 (the fixture imported above)
) -> None:
    _, reader = telemetry
    for i in range(3):
        store.append(f"order-{i}", [order(i)])
    catch_up(store, trigger_projection(engine, triggered.get("on_order")))
    points = metric_points(reader)
    ours = {"workflow": "on_order"}
    counted = [p for p in points["ledgerflow.workflow.runs_triggered"] if p.attributes == ours]
    assert sum(p.value for p in counted) >= 3  # the provider is the process's: earlier tests count too
    delays = [p for p in points["ledgerflow.workflow.trigger_delay"] if p.attributes == ours]
    assert sum(p.count for p in delays) >= 3


def test_a_consumer_ended_by_an_unexpected_error_is_replaced(
    store: EventStore, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[ProjectorWorker] = []

    class Flaky(ProjectorWorker):
        def run(self) -> None:
            made.append(self)
            if len(made) == 1:
                raise RuntimeError("a bug")
            super().run()

    monkeypatch.setattr(triggers, "ProjectorWorker", Flaky)
    monkeypatch.setattr(triggers, "_RESTART_AFTER", 0.01)
    consumer = triggers.TriggerConsumer(engine, triggered, worker_id="flaky")
    consumer.start()
    try:
        store.append("order-1", [order(1)])
        wait_until(lambda: len(started_runs(store)) == 1, what="the replacement consumer's start")
    finally:
        consumer.stop()
    assert len(made) == 2

"""Projections: catch-up through durable cursors, runs recorded, the stream catalogue."""

from __future__ import annotations

import psycopg
import pytest

from eventstore import EventStore, NewEvent
from projector import ProjectorWorker, WorkerSettings, rebuild, run_rows, stream_catalogue, verify
from projector.digest import projection_digest
from tests.projections import make_counter

FAST = WorkerSettings(lease_ttl=5, heartbeat_interval=1, batch_size=7)


def rows(store: EventStore, query: str) -> list[tuple[object, ...]]:
    with store.pool.connection() as conn:
        return conn.execute(query).fetchall()  # type: ignore[arg-type]


def test_catalogue_follows_the_log(store: EventStore) -> None:
    store.append("order-1", [NewEvent("A", {}), NewEvent("B", {})])
    store.append("user-7", [NewEvent("A", {})], tenant="acme")
    worker = ProjectorWorker(store, [stream_catalogue], FAST)
    worker.run_until_caught_up()
    store.append("order-1", [NewEvent("C", {})])
    worker.run_until_caught_up()
    got = rows(
        store,
        "SELECT tenant, stream_id, category, version FROM ledgerflow.stream_catalogue ORDER BY 1, 2",
    )
    assert got == [("acme", "user-7", "user", 1), ("default", "order-1", "order", 3)]
    worker.release_all()


def test_catch_up_is_recorded_as_a_run(store: EventStore) -> None:
    for i in range(20):
        store.append(f"s-{i % 3}", [NewEvent("Add", {"amount": i})])
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        (run,) = run_rows.list_runs(conn, counter.name)
    assert (run.kind, run.status, run.events_processed, run.trigger) == (
        "catch_up",
        "completed",
        20,
        "lease_acquired",
    )
    assert run.owner == worker.id
    assert rows(store, "SELECT sum(n), sum(total) FROM ledgerflow.counts") == [(20, sum(range(20)))]
    worker.release_all()


def test_rebuild_swaps_in_an_equal_copy_and_verify_agrees(store: EventStore) -> None:
    for i in range(50):
        store.append(f"s-{i % 4}", [NewEvent("Add", {"amount": i})])
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        live = projection_digest(conn, counter, counter.schema)
    result = rebuild(store, counter)
    assert result.digest == live
    assert result.events == 50
    checked = verify(store, counter)
    assert checked.equal
    assert checked.differences == []
    # The old tables stay for rollback until the next rebuild.
    assert rows(store, "SELECT count(*) FROM lf_retired_test_counter.counts") == [(4,)]
    # The live worker goes on over the swapped tables.
    store.append("s-9", [NewEvent("Add", {"amount": 1})])
    worker.run_until_caught_up()
    assert rows(store, "SELECT n FROM ledgerflow.counts WHERE stream_id = 's-9'") == [(1,)]
    assert rows(store, "SELECT max(times) FROM ledgerflow.applied") == [(1,)]
    worker.release_all()


def test_verify_names_rows_that_differ(store: EventStore) -> None:
    for i in range(5):
        store.append("s", [NewEvent("Add", {"amount": i})])
    counter = make_counter()
    worker = ProjectorWorker(store, [counter], FAST)
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        conn.execute("UPDATE ledgerflow.counts SET total = 999")
    result = verify(store, counter)
    assert not result.equal
    (diff,) = result.differences
    assert diff.table == "counts"
    assert diff.only_in_live == ["(s,5,999)"]
    assert diff.only_in_rebuilt == ["(s,5,10)"]
    with store.pool.connection() as conn:
        last = run_rows.list_runs(conn, counter.name, limit=1)[0]
    assert (last.kind, last.status) == ("verify", "failed")
    assert "digest mismatch" in (last.error or "")
    worker.release_all()


def test_the_log_is_never_touched_by_projections(store: EventStore) -> None:
    store.append("s", [NewEvent("Add", {"amount": 1})])
    worker = ProjectorWorker(store, [make_counter()], FAST)
    worker.run_until_caught_up()
    with store.pool.connection() as conn, pytest.raises(psycopg.Error):
        conn.execute("DELETE FROM ledgerflow.events")
    worker.release_all()

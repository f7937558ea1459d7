"""Replay, rebuild and verify are safe on every built-in projection: a replay from any cursor, then
catching up, gives exactly what a rebuild gives; projections are pure functions of the log, also when
an append made inside a long transaction lands in the log before an earlier-committed one; one
operator run per projection and scope at a time, with scratch schemas that never outlive their run."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eventstore import Cursor, EventStore, InvalidInputError, NewEvent
from projector import (
    ProjectorWorker,
    RunInProgressError,
    WorkerSettings,
    cursor_rows,
    failure_rows,
    operator_runs,
    rebuild,
    replay,
    run_rows,
    start_replay,
    start_verify,
    stream_catalogue,
    sweep_abandoned,
    verify,
)
from projector.projection import Projection
from tests.flows import registry
from tests.waiting import joined, wait_until
from workflows import Engine, WorkflowWorker, workflow_tables
from workflows import WorkerSettings as FlowWorkerSettings

FAST = WorkerSettings(lease_ttl=30, heartbeat_interval=10, batch_size=3)
TENANTS = ("default", "acme", "globex")


def all_cursors(store: EventStore) -> list[Cursor]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT transaction_id::text::bigint, position FROM ledgerflow.events ORDER BY 1, 2"
        ).fetchall()
    return [Cursor(0, 0), *(Cursor(tx, pos) for tx, pos in rows)]


def live_cursor(store: EventStore, projection: Projection) -> Cursor:
    with store.pool.connection() as conn:
        current = cursor_rows.get_cursor(conn, projection.name)
    assert current is not None
    return current.cursor


def run_of(store: EventStore, run_id: int) -> run_rows.Run:
    with store.pool.connection() as conn:
        run = run_rows.get_run(conn, run_id)
    assert run is not None
    return run


# An action: append to a stream of a tenant; append inside a transaction that stays open across the
# following actions (its events enter the log's resume order before events committed meanwhile); commit
# that transaction; or let the projector apply a few batches.
appends = st.tuples(st.just("append"), st.integers(0, 3), st.sampled_from(TENANTS), st.integers(1, 3))
long_appends = st.tuples(st.just("long"), st.integers(0, 3), st.sampled_from(TENANTS), st.integers(1, 2))
commits = st.tuples(st.just("commit"), st.just(0), st.just("default"), st.just(0))
steps = st.tuples(st.just("step"), st.integers(1, 3), st.just("default"), st.just(0))
actions = st.lists(st.one_of(appends, long_appends, commits, steps), min_size=1, max_size=20)


@given(actions=actions, replay_at=st.floats(0, 1), tenant=st.sampled_from((None, *TENANTS)))
@settings(max_examples=20)
def test_stream_catalogue_replayed_from_any_cursor_equals_its_rebuild(
    store: EventStore,
    actions: list[tuple[str, int, str, int]],
    replay_at: float,
    tenant: str | None,
) -> None:
    worker = ProjectorWorker(store, [stream_catalogue], FAST)
    try:
        check_replay(store, worker, actions, replay_at, tenant)
    finally:
        worker.release_all()


def check_replay(
    store: EventStore,
    worker: ProjectorWorker,
    actions: list[tuple[str, int, str, int]],
    replay_at: float,
    tenant: str | None,
) -> None:
    prefix = uuid.uuid4().hex[:6]
    # The long transaction takes its id (and start time) when it opens; its appends are made just before
    # it commits, after appends of other transactions to the same streams. So its events come first in
    # the log's resume order, though they carry the higher stream versions.
    long_conn = None
    pending: list[tuple[str, str, int]] = []

    def commit_long() -> None:
        nonlocal long_conn
        if long_conn is None:
            return
        for stream, who, count in pending:
            events = [NewEvent("Seen", {"i": i}) for i in range(count)]
            store.append(stream, events, tenant=who, conn=long_conn)
        long_conn.execute("COMMIT")
        store.pool.putconn(long_conn)
        long_conn, pending[:] = None, []

    try:
        for kind, n, who, count in actions:
            if kind == "append":
                store.append(f"{prefix}s-{n}", [NewEvent("Seen", {"i": i}) for i in range(count)], tenant=who)
            elif kind == "long":
                if long_conn is None:
                    long_conn = store.pool.getconn()
                    long_conn.execute("BEGIN")
                    long_conn.execute("SELECT pg_current_xact_id()")
                pending.append((f"{prefix}s-{n}", who, count))
            elif kind == "commit":
                commit_long()
            else:
                worker.acquire_free_leases()
                for _ in range(n):
                    worker.work_once()
        commit_long()
    finally:
        if long_conn is not None:
            long_conn.execute("ROLLBACK")
            store.pool.putconn(long_conn)
    worker.run_until_caught_up()
    assert verify(store, stream_catalogue).equal, "incremental differs from a rebuild before any replay"

    # Replay from any cursor behind the projection's (its row moves with the batches it applies).
    live = live_cursor(store, stream_catalogue)
    cursors = [c for c in all_cursors(store) if c < live]
    assume(cursors)
    after = cursors[int(replay_at * (len(cursors) - 1))]
    run_id = replay(store, stream_catalogue, after=after, tenant=tenant)
    worker.run_until_caught_up()
    assert run_of(store, run_id).status == "completed"
    result = verify(store, stream_catalogue)
    assert result.equal, result.differences
    for who in TENANTS:
        assert verify(store, stream_catalogue, tenant=who).equal


@pytest.fixture
def flows(store: EventStore) -> Iterator[Engine]:
    engine = Engine(store, registry)
    worker = WorkflowWorker(
        engine,
        registry,
        FlowWorkerSettings(concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.05),
        name="replay-test",
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    yield engine
    worker.stop()
    thread.join(timeout=15)


def finish_runs(engine: Engine, workflows: list[str]) -> None:
    run_ids = [engine.start(name, input={"n": i}).run_id for i, name in enumerate(workflows)]
    for run_id in run_ids:
        wait_until(lambda r=run_id: not engine.load(r).active, what=f"run {run_id} to end")


@given(replay_at=st.floats(0, 1))
@settings(max_examples=6)
def test_workflow_tables_replayed_from_any_cursor_equal_a_rebuild(
    flows: Engine, store: EventStore, replay_at: float
) -> None:
    """The tables hold inserts and counters, so they are not replayed in place: a replay runs as a
    rebuild, says so, and leaves the projection running (it used to block on a duplicate run row)."""
    finish_runs(flows, ["linear", "diamond"])
    worker = ProjectorWorker(store, [workflow_tables], FAST)
    try:
        check_workflow_replay(flows, store, worker, replay_at)
    finally:
        worker.release_all()


def check_workflow_replay(
    flows: Engine, store: EventStore, worker: ProjectorWorker, replay_at: float
) -> None:
    worker.run_until_caught_up()
    live = live_cursor(store, workflow_tables)
    cursors = [c for c in all_cursors(store) if c < live]
    after = cursors[int(replay_at * (len(cursors) - 1))]

    pending = start_replay(store, workflow_tables, after=after)
    assert pending.kind == "rebuild"
    assert pending.note is not None
    assert "cannot be replayed in place" in pending.note
    pending.execute()
    assert run_of(store, pending.run_id).status == "completed"
    finish_runs(flows, ["linear"])  # the projection goes on after the replay
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        assert not failure_rows.open_failures(conn, workflow_tables.name)
    assert verify(store, workflow_tables).equal


def test_a_replay_starts_at_once_without_a_new_append(store: EventStore) -> None:
    for i in range(5):
        last = store.append(f"idle-{i}", [NewEvent("Seen", {})]).events[0]
    worker = ProjectorWorker(
        store, [stream_catalogue], WorkerSettings(poll_interval=30, heartbeat_interval=1)
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker._runners, what="the lease")
        catalogue = worker._runners[stream_catalogue.name]
        # Caught up once the last append is read. Not `committed_so_far()`: other tests' transactions,
        # which share the cluster's ids, move it on after the worker's read, and the idle worker would
        # read again only at its 30 s poll (no append here wakes it).
        target = Cursor(last.transaction_id, last.position)
        wait_until(lambda: catalogue.read_cursor > target, what="catch-up")
        run_id = replay(store, stream_catalogue, after=Cursor(0, 0))
        # The poll interval is 30 s: only the wake-up and the idle cursor check can finish this in time.
        wait_until(lambda: run_of(store, run_id).status == "completed", timeout=5, what="the replay")
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert verify(store, stream_catalogue).equal


def test_one_verify_at_a_time_names_the_running_one(store: EventStore) -> None:
    store.append("v-1", [NewEvent("Seen", {})])
    worker = ProjectorWorker(store, [stream_catalogue])
    worker.run_until_caught_up()
    worker.release_all()
    first = start_verify(store, stream_catalogue)
    with pytest.raises(RunInProgressError) as refused:
        start_verify(store, stream_catalogue)
    assert refused.value.run_id == first.run_id
    assert refused.value.details() == {
        "projection": "stream_catalogue",
        "run_id": first.run_id,
        "kind": "verify",
    }
    # A rebuild or replay of the same scope waits too; another tenant's slice does not.
    with pytest.raises(RunInProgressError):
        start_replay(store, stream_catalogue, after=Cursor(0, 0))
    start_verify(store, stream_catalogue, tenant="acme").execute()
    first.execute()
    assert run_of(store, first.run_id).status == "completed"
    start_verify(store, stream_catalogue).execute()  # free again


def test_twenty_concurrent_verifies_one_runs_the_rest_are_refused(store: EventStore) -> None:
    for i in range(50):
        store.append(f"c-{i % 7}", [NewEvent("Seen", {})])
    worker = ProjectorWorker(store, [stream_catalogue])
    worker.run_until_caught_up()
    worker.release_all()
    outcomes: list[object] = []
    gate = threading.Barrier(20, timeout=60)

    def attempt() -> None:
        gate.wait()
        try:
            outcomes.append(verify(store, stream_catalogue))
        except RunInProgressError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    results = [o for o in outcomes if not isinstance(o, RunInProgressError)]
    assert results, "no verify ran"
    assert all(r.equal for r in results)  # type: ignore[attr-defined]
    assert len(results) + sum(isinstance(o, RunInProgressError) for o in outcomes) == 20
    with store.pool.connection() as conn:
        assert run_rows.scratch_schemas(conn) == []


def test_a_crashed_runs_scratch_schema_is_dropped_and_its_run_marked(store: EventStore) -> None:
    crashed = start_verify(store, stream_catalogue)
    with store.pool.connection() as conn:
        # What a verify that died mid-build leaves: its scratch schema, and a run nobody heartbeats.
        conn.execute(f"CREATE SCHEMA lf_verify_stream_catalogue_{crashed.run_id}")
        conn.execute(
            "UPDATE ledgerflow.projection_runs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (crashed.run_id,),
        )
        assert [r[0] for r in sweep_abandoned(conn)] == [crashed.run_id]
        assert run_rows.scratch_schemas(conn) == []
    assert run_of(store, crashed.run_id).status == "abandoned"
    start_verify(store, stream_catalogue).execute()  # the scope is free again


def test_a_shared_projection_has_no_tenant_scope(store: EventStore) -> None:
    with pytest.raises(InvalidInputError, match="shared by every tenant"):
        start_verify(store, workflow_tables, tenant="acme")


def test_a_tenant_rebuild_touches_only_that_tenants_rows(store: EventStore) -> None:
    for who in TENANTS:
        store.append(f"t-{who}", [NewEvent("Seen", {})], tenant=who)
    worker = ProjectorWorker(store, [stream_catalogue])
    worker.run_until_caught_up()
    worker.release_all()
    with store.pool.connection() as conn:
        # Damage every tenant's row; a rebuild of acme's rows repairs acme's alone.
        conn.execute("UPDATE ledgerflow.stream_catalogue SET version = 99")
    replay(store, stream_catalogue, after=Cursor(0, 0), tenant="acme")
    with store.pool.connection() as conn:
        rows = dict(conn.execute("SELECT tenant, version FROM ledgerflow.stream_catalogue").fetchall())
    assert rows == {"default": 99, "acme": 1, "globex": 99}
    assert verify(store, stream_catalogue, tenant="acme").equal
    assert not verify(store, stream_catalogue, tenant="globex").equal


def test_every_built_in_declares_how_it_replays() -> None:
    built_in: list[Projection] = [stream_catalogue, workflow_tables]
    assert {p.name: (p.per_tenant, p.replay_in_place) for p in built_in} == {
        "stream_catalogue": (True, True),
        "workflow_tables": (False, False),
    }


def test_a_run_waiting_for_a_job_thread_keeps_its_heartbeat(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operator_runs, "HEARTBEAT_INTERVAL", 0.05)
    pending = start_verify(store, stream_catalogue)
    recorded = run_of(store, pending.run_id).heartbeat_at
    pending.start_heartbeats()  # as the API does when it queues the run
    wait_until(lambda: run_of(store, pending.run_id).heartbeat_at > recorded, what="a heartbeat")
    pending.execute()
    assert run_of(store, pending.run_id).status == "completed"


def test_a_rebuild_waits_for_a_reader_holding_the_tables_then_swaps(store: EventStore) -> None:
    store.append("busy-1", [NewEvent("Seen", {})])
    worker = ProjectorWorker(store, [stream_catalogue])
    worker.run_until_caught_up()
    worker.release_all()
    reader = store.pool.getconn()
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM ledgerflow.stream_catalogue")  # holds ACCESS SHARE
        released = threading.Timer(0.5, lambda: reader.execute("COMMIT"))
        released.start()
        result = rebuild(store, stream_catalogue)  # yields (lock timeout), retries, then swaps
        joined(released)
    finally:
        store.pool.putconn(reader)
    assert run_of(store, result.run_id).status == "completed"
    assert verify(store, stream_catalogue).equal

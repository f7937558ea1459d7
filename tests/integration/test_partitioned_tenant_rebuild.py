"""A tenant's rows of a partitioned per-tenant projection are rebuilt, replayed and verified alone, with the
guarantees of an unpartitioned one (projector/tenant_rebuild.py): one fence per segment at its cursor; the
other tenants' events go on being applied by the segment workers meanwhile; the tenant's own events that
arrive during the rebuild are applied once its fences are lifted, none lost, none twice; afterwards the
projection equals its rebuild."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import Cursor, EventStore, NewEvent
from projector import (
    ProjectorWorker,
    RebuildResult,
    WorkerSettings,
    cursor_rows,
    lease_rows,
    list_runs,
    rebuild,
    replay,
    run_rows,
    stream_segment,
    verify,
)
from projector.digest import projection_digest
from projector.projection import Projection
from tests.projections import make_tenant_counter
from tests.waiting import joined, wait_until

A, B = "tenant-a", "tenant-b"
PARTITIONS = 3


def tenant_counter(partitions: int = PARTITIONS) -> Projection:
    schema = f"tp_{uuid.uuid4().hex[:10]}"
    return make_tenant_counter(schema, schema, partitions)


def streams_in_every_segment(prefix: str, partitions: int = PARTITIONS) -> list[str]:
    """One stream id per segment, so every segment has the tenant's events."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        found.setdefault(stream_segment(f"{prefix}-{i}", partitions), f"{prefix}-{i}")
        i += 1
    return [found[k] for k in range(partitions)]


def counts(store: EventStore, p: Projection) -> dict[tuple[str, str], int]:
    with store.pool.connection() as conn:
        rows = conn.execute(f'SELECT tenant, stream_id, n FROM "{p.schema}".counts').fetchall()
    return {(t, s): n for t, s, n in rows}


def applied_once(store: EventStore, p: Projection) -> None:
    with store.pool.connection() as conn:
        query = f'SELECT count(*), coalesce(max(times), 1) FROM "{p.schema}".applied'
        applied = conn.execute(query).fetchone()
        in_log = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert in_log is not None
    assert applied == (in_log[0], 1), "an event was missed or applied twice"


def fences(store: EventStore) -> list[tuple[str, str]]:
    with store.pool.connection() as conn:
        rows = conn.execute("SELECT projection, tenant FROM ledgerflow.projection_tenant_fences ORDER BY 1")
        return [(r[0], r[1]) for r in rows]


def segment_cursors(store: EventStore, p: Projection) -> dict[int, Cursor]:
    with store.pool.connection() as conn:
        return cursor_rows.segment_cursors(conn, p.name)


def digest(store: EventStore, p: Projection, tenant: str) -> str:
    with store.pool.connection() as conn:
        return projection_digest(conn, p, p.schema, tenant=tenant)


def _config() -> WorkerSettings:
    return WorkerSettings(lease_ttl=30, heartbeat_interval=10, batch_size=4, balance_interval=0)


@contextmanager
def holding_a_row(store: EventStore, p: Projection, tenant: str) -> Iterator[None]:
    """Hold one of `tenant`'s live rows: the replacement of its rows waits for it (as a big tenant's would
    take its time), after the fences are set. A batch that wrongly applied the tenant's events would wait
    too: the hold ends by itself after 20 s, so such a test fails rather than hangs."""
    holder = psycopg.connect(store.url, autocommit=False)
    try:
        holder.execute("SET idle_in_transaction_session_timeout = '20s'")
        holder.execute(f'SELECT 1 FROM "{p.schema}".counts WHERE tenant = %s LIMIT 1 FOR UPDATE', (tenant,))
        yield
    finally:
        with suppress(psycopg.Error):
            holder.rollback()
        holder.close()


def test_segment_workers_apply_other_tenants_while_a_tenants_rows_are_rebuilt(store: EventStore) -> None:
    p = tenant_counter()
    a_streams, b_streams = streams_in_every_segment("a"), streams_in_every_segment("b")
    for tenant, streams in ((A, a_streams), (B, b_streams)):
        for s in streams:
            store.append(s, [NewEvent("Seen", {}), NewEvent("Seen", {})], tenant=tenant)
    first = ProjectorWorker(store, [p], _config())
    first.run_until_caught_up()
    first.release_all()
    incremental = digest(store, p, A)
    with store.pool.connection() as conn:  # damage A's rows: the rebuild must replace them
        conn.execute(f'UPDATE "{p.schema}".counts SET n = 99 WHERE tenant = %s', (A,))

    # Two segment workers in threads of their own, sharing the segments, running throughout.
    workers = [ProjectorWorker(store, [p], WorkerSettings(batch_size=4, balance_interval=0.05)) for _ in "12"]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    result: list[RebuildResult] = []
    with holding_a_row(store, p, A):
        rebuilding = threading.Thread(target=lambda: result.append(rebuild(store, p, tenant=A)), daemon=True)
        rebuilding.start()
        keys = [(f"{p.name}#{k}", A) for k in range(PARTITIONS)]
        wait_until(lambda: fences(store) == keys, what="tenant A to be fenced in every segment")
        before = segment_cursors(store, p)
        for s in b_streams:
            store.append(s, [NewEvent("Seen", {})], tenant=B)
        for s in a_streams:  # A's own events, during its rebuild, one in every segment
            store.append(s, [NewEvent("Seen", {})], tenant=A)
        store.append("b-new", [NewEvent("Seen", {})], tenant=B)
        # B's events are applied, every segment moves on past A's; A's rows wait for the lift.
        wait_until(
            lambda: (
                all(counts(store, p).get((B, s)) == 3 for s in b_streams)
                and counts(store, p).get((B, "b-new")) == 1
            ),
            what="B's events to be applied while A is fenced",
        )
        wait_until(
            lambda: all(c > before[k] for k, c in segment_cursors(store, p).items()),
            what="every segment's cursor to move past A's events",
        )
        assert all(n == 99 for (t, _), n in counts(store, p).items() if t == A)
        assert rebuilding.is_alive()
    joined(rebuilding, timeout=30)
    assert result
    assert fences(store) == []
    assert result[0].digest == incremental  # A's rows as the incremental build had them at the fences
    # The batches left A's events; the lift applied them, of every segment.
    assert all(counts(store, p)[(A, s)] == 3 for s in a_streams)
    for w in workers:
        w.stop()
    joined(*threads)
    last = ProjectorWorker(store, [p], _config())
    last.run_until_caught_up()
    last.release_all()
    applied_once(store, p)
    assert verify(store, p).equal
    assert verify(store, p, tenant=A).equal
    with store.pool.connection() as conn:
        live = projection_digest(conn, p, p.schema)
    assert rebuild(store, p).digest == live


def test_the_copy_of_a_tenants_rows_stops_at_each_segments_fence(store: EventStore) -> None:
    p = tenant_counter()
    a = streams_in_every_segment("a")
    for s in a:
        store.append(s, [NewEvent("Seen", {})], tenant=A)
    worker = ProjectorWorker(store, [p], _config())
    worker.run_until_caught_up()
    worker.release_all()
    # Segment 0 lags (its lease held by a worker that does nothing) with one of A's events unapplied,
    # while segment 1 applies a later one of A's: the fences stand at different cursors.
    with store.pool.connection() as conn:
        epoch = lease_rows.acquire_lease(conn, f"{p.name}#0", "stalled", 60)
    assert epoch is not None
    store.append(a[0], [NewEvent("Seen", {})], tenant=A)
    e = store.append(a[1], [NewEvent("Seen", {})], tenant=A).events[0]
    later = Cursor(e.transaction_id, e.position)
    wait_until(
        lambda: worker.work_once() or segment_cursors(store, p)[1] >= later,
        what="segment 1 to apply A's later event",
    )
    assert segment_cursors(store, p)[0] < later
    rebuild(store, p, tenant=A)
    assert counts(store, p)[(A, a[0])] == 1, "the copy took an event past segment 0's fence"
    assert counts(store, p)[(A, a[1])] == 2
    with store.pool.connection() as conn:
        lease_rows.release_lease(conn, f"{p.name}#0", "stalled", epoch)
    worker.run_until_caught_up()  # segment 0 applies its event now, once
    worker.release_all()
    applied_once(store, p)
    assert verify(store, p).equal


def waiting_on_locks(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("rebuilt_with", [PARTITIONS, 2], ids=["same-partitions", "fewer-partitions"])
def test_a_whole_rebuild_during_a_tenants_rebuild_counts_every_event_once(
    store: EventStore, rebuilt_with: int
) -> None:
    p = tenant_counter()
    a, b = streams_in_every_segment("a"), streams_in_every_segment("b")
    for tenant, streams in ((A, a), (B, b)):
        for s in streams:
            store.append(s, [NewEvent("Seen", {})], tenant=tenant)
    worker = ProjectorWorker(store, [p], _config())
    worker.run_until_caught_up()
    outcomes: list[object] = []

    def rebuilding(projection: Projection, tenant: str | None) -> threading.Thread:
        def run() -> None:
            try:
                outcomes.append(rebuild(store, projection, tenant=tenant))
            except Exception as exc:  # the tenant's, when the whole rebuild changed the partitions
                outcomes.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    # The whole projection rebuilt by code with `rebuilt_with` partitions (an operator after a deploy).
    whole = make_tenant_counter(p.name, p.schema, rebuilt_with)
    with holding_a_row(store, p, A):
        tenant_rebuild = rebuilding(p, A)
        wait_until(lambda: len(fences(store)) == PARTITIONS, what="tenant A to be fenced in every segment")
        for s in a + b:
            store.append(s, [NewEvent("Seen", {})], tenant=A if s in a else B)
        worker.run_until_caught_up()  # B's events applied, A's left for the lift
        assert all(counts(store, p)[(B, s)] == 2 for s in b)
        # Its swap waits for A's replacement (which waits for the held row), then puts A's rows at its
        # cursor and A's fences there too.
        whole_rebuild = rebuilding(whole, None)
        wait_until(lambda: waiting_on_locks(store) >= 2, what="the whole rebuild to wait for tenant A's")
    joined(tenant_rebuild, whole_rebuild, timeout=30)
    worker.release_all()
    assert len(outcomes) == 2
    if rebuilt_with == PARTITIONS:
        assert all(isinstance(o, RebuildResult) for o in outcomes), outcomes
        assert fences(store) == []
    else:  # A's run failed at its lift; its fences, at the swap's cursor in the new segments, stay
        assert [(k, t) for k, t in fences(store)] == [(f"{p.name}#{k}", A) for k in range(rebuilt_with)]
    for s in a:
        store.append(s, [NewEvent("Seen", {})], tenant=A)
    after = ProjectorWorker(store, [whole], _config())
    after.run_until_caught_up()  # each segment lifts a fence left behind, from the swap's cursor
    after.release_all()
    assert fences(store) == []
    assert all(counts(store, p)[(A, s)] == 3 for s in a)
    applied_once(store, p)
    assert verify(store, whole).equal


def test_fences_of_a_dead_tenant_rebuild_are_lifted_by_each_segment(store: EventStore) -> None:
    p = tenant_counter()
    a_streams = streams_in_every_segment("a")
    for s in a_streams:
        store.append(s, [NewEvent("Seen", {})], tenant=A)
    worker = ProjectorWorker(store, [p], _config())
    worker.run_until_caught_up()
    at = segment_cursors(store, p)
    with store.pool.connection() as conn:
        # A run that fenced tenant A in every segment and died: its fences stay, its run has ended.
        run_id = run_rows.start_run(
            conn,
            p.name,
            "rebuild",
            trigger="t",
            actor="t",
            owner="gone",
            start=Cursor(),
            target=None,
            tenant=A,
        )
        for k, c in at.items():
            conn.execute(
                "INSERT INTO ledgerflow.projection_tenant_fences VALUES (%s, %s, %s, %s, %s)",
                (f"{p.name}#{k}", A, run_id, c.transaction_id, c.position),
            )
        run_rows.finish_run(conn, run_id, "abandoned")
    for s in a_streams:
        store.append(s, [NewEvent("Seen", {}), NewEvent("Seen", {})], tenant=A)
    store.append("b", [NewEvent("Seen", {})], tenant=B)
    worker.run_until_caught_up()
    assert fences(store) == []
    assert all(counts(store, p)[(A, s)] == 3 for s in a_streams)
    applied_once(store, p)
    assert verify(store, p).equal
    worker.release_all()


def test_a_tenant_replay_of_a_partitioned_projection_is_a_tenant_rebuild(store: EventStore) -> None:
    p = tenant_counter()
    first = store.append("a-1", [NewEvent("Seen", {})], tenant=A)
    store.append("b-1", [NewEvent("Seen", {})], tenant=B)
    worker = ProjectorWorker(store, [p], _config())
    worker.run_until_caught_up()
    e = first.events[0]
    run_id = replay(store, p, after=Cursor(e.transaction_id, e.position), tenant=A)
    with store.pool.connection() as conn:
        runs = {r.id: r for r in list_runs(conn, p.name, 10)}
    assert runs[run_id].kind == "rebuild"
    assert runs[run_id].tenant == A
    assert verify(store, p, tenant=A).equal
    applied_once(store, p)
    worker.release_all()


# -- a property: whatever the interleaving of appends and segment batches with a tenant's rebuild --------

# An action: append to a tenant's stream, or let the worker apply a batch of each segment, a few times.
appends = st.tuples(st.just("append"), st.sampled_from([A, B]), st.integers(0, 5))
steps = st.tuples(st.just("step"), st.just(""), st.integers(1, 3))
actions = st.lists(st.one_of(appends, steps), max_size=8)


@given(before=actions, during=actions, after=actions, partitions=st.integers(2, 4))
@settings(max_examples=5, deadline=None)
def test_a_tenant_rebuild_amid_segment_batches_equals_the_rebuild(
    store: EventStore,
    before: list[tuple[str, str, int]],
    during: list[tuple[str, str, int]],
    after: list[tuple[str, str, int]],
    partitions: int,
) -> None:
    p = tenant_counter(partitions)
    worker = ProjectorWorker(store, [p], WorkerSettings(batch_size=2, balance_interval=0))

    def act(kind: str, tenant: str, n: int) -> None:
        if kind == "append":
            store.append(f"{tenant}-{n}", [NewEvent("Seen", {})], tenant=tenant)
        else:
            for _ in range(n):
                worker.work_once()

    store.append(f"{A}-held", [NewEvent("Seen", {})], tenant=A)
    worker.run_until_caught_up()
    for action in before:  # the segments' cursors drift apart
        act(*action)
    result: list[RebuildResult] = []
    with holding_a_row(store, p, A):
        rebuilding = threading.Thread(target=lambda: result.append(rebuild(store, p, tenant=A)), daemon=True)
        rebuilding.start()
        wait_until(lambda: len(fences(store)) == partitions, what="tenant A to be fenced in every segment")
        for action in during:
            act(*action)
    joined(rebuilding, timeout=30)
    assert result
    assert fences(store) == []
    for action in after:
        act(*action)
    worker.run_until_caught_up()
    worker.release_all()
    applied_once(store, p)
    assert verify(store, p).equal  # the live projection equals its copy rebuilt from the log

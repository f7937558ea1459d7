"""A tenant's rebuild of its rows of a per-tenant projection never stops the projection for the others
(migration 0036): while the replacement of tenant A's rows is held up, the live projection keeps applying
tenant B's events and its cursor moves on; A's own events appended meanwhile are applied when the fence is
lifted; the result equals an incremental build, digest for digest."""

from __future__ import annotations

import threading

import psycopg

from eventstore import EventStore, NewEvent
from projector import ProjectorWorker, RebuildResult, cursor_rows, rebuild, run_rows, stream_catalogue, verify
from projector.digest import projection_digest
from projector.projection import ApplyContext, Projection, Table
from tests.waiting import wait_until

A, B = "tenant-a", "tenant-b"

# A projection that counts: applying an event twice, or missing one, shows in its rows (the catalogue's
# upserts would hide both).
counts = Projection(
    name="tenant_event_counts",
    version=1,
    per_tenant=True,
    tables=[
        Table(
            "tenant_event_counts",
            "CREATE TABLE {table} (tenant text NOT NULL, stream_id text NOT NULL, n bigint NOT NULL, "
            "PRIMARY KEY (tenant, stream_id))",
        )
    ],
)


@counts.on_any
def _count(ctx: ApplyContext, event: object) -> None:
    ctx.execute(
        """INSERT INTO {tenant_event_counts} AS c VALUES (%s, %s, 1)
           ON CONFLICT (tenant, stream_id) DO UPDATE SET n = c.n + 1""",
        (event.tenant, event.stream_id),
    )


def cursor(store: EventStore) -> cursor_rows.CursorState:
    with store.pool.connection() as conn:
        current = cursor_rows.get_cursor(conn, stream_catalogue.name)
    assert current is not None
    return current


def versions(store: EventStore, tenant: str) -> dict[str, int]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT stream_id, version FROM ledgerflow.stream_catalogue WHERE tenant = %s", (tenant,)
        ).fetchall()
    return dict(rows)


def fences(store: EventStore) -> list[str]:
    with store.pool.connection() as conn:
        return [r[0] for r in conn.execute("SELECT tenant FROM ledgerflow.projection_tenant_fences")]


def digest(store: EventStore, tenant: str) -> str:
    with store.pool.connection() as conn:
        return projection_digest(conn, stream_catalogue, stream_catalogue.schema, tenant=tenant)


def catch_up(worker: ProjectorWorker) -> None:
    """The live projection catches up, in a thread: if it hangs behind a lock the test fails, not hangs."""
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run_until_caught_up(timeout=30)
        except BaseException as exc:  # reported below
            failed.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "the live projection did not catch up: it waits behind the tenant's rebuild"
    assert not failed, failed


def test_the_projection_advances_for_b_while_as_rows_are_rebuilt(store: EventStore) -> None:
    for tenant in (A, B):
        for i in range(3):
            store.append(f"{tenant}-{i}", [NewEvent("Seen", {}), NewEvent("Seen", {})], tenant=tenant)
    worker = ProjectorWorker(store, [stream_catalogue])
    catch_up(worker)
    incremental = digest(store, A)

    # Hold one of A's live rows: the replacement of A's rows (a DELETE of them) waits for it, the way a
    # long replacement of a big tenant's rows would take its time.
    holder = psycopg.connect(store.url, autocommit=False)
    try:
        holder.execute("SELECT 1 FROM ledgerflow.stream_catalogue WHERE tenant = %s FOR UPDATE", (A,))
        result: list[RebuildResult] = []
        rebuilding = threading.Thread(
            target=lambda: result.append(rebuild(store, stream_catalogue, tenant=A)), daemon=True
        )
        rebuilding.start()
        wait_until(lambda: fences(store) == [A], what="tenant A to be fenced")

        before = cursor(store).cursor
        store.append(f"{B}-new", [NewEvent("Seen", {})], tenant=B)
        store.append(f"{A}-0", [NewEvent("Seen", {})], tenant=A)  # A's own event, during its rebuild
        store.append(f"{B}-0", [NewEvent("Seen", {})], tenant=B)
        catch_up(worker)

        # B's events are applied and the cursor moved past all three appends; A's waits for the lift.
        assert cursor(store).cursor > before
        assert versions(store, B) == {f"{B}-new": 1, f"{B}-0": 3, f"{B}-1": 2, f"{B}-2": 2}
        assert versions(store, A)[f"{A}-0"] == 2
        assert rebuilding.is_alive()
    finally:
        holder.rollback()
        holder.close()
    rebuilding.join(30)
    assert not rebuilding.is_alive(), "the rebuild did not finish"
    assert result
    assert fences(store) == []
    assert versions(store, A) == {f"{A}-0": 3, f"{A}-1": 2, f"{A}-2": 2}  # the lift applied A's event
    # The run's digest is A's rows as an incremental build gave them at the fence's cursor.
    assert result[0].digest == incremental
    catch_up(worker)
    assert verify(store, stream_catalogue).equal
    assert verify(store, stream_catalogue, tenant=A).equal
    worker.release_all()


def test_a_rebuilt_tenant_equals_its_incremental_build(store: EventStore) -> None:
    for i in range(5):
        store.append(f"s-{i}", [NewEvent("Seen", {}) for _ in range(i + 1)], tenant=A)
        store.append(f"s-{i}", [NewEvent("Seen", {})], tenant=B)
    worker = ProjectorWorker(store, [stream_catalogue])
    catch_up(worker)
    incremental = {t: digest(store, t) for t in (A, B)}
    with store.pool.connection() as conn:
        conn.execute("UPDATE ledgerflow.stream_catalogue SET version = 99 WHERE tenant = %s", (A,))
    result = rebuild(store, stream_catalogue, tenant=A)
    assert result.digest == incremental[A]
    assert {t: digest(store, t) for t in (A, B)} == incremental
    worker.release_all()


def test_a_fence_left_by_a_dead_rebuild_is_lifted_by_the_live_projection(store: EventStore) -> None:
    store.append("s", [NewEvent("Seen", {})], tenant=A)
    worker = ProjectorWorker(store, [stream_catalogue])
    catch_up(worker)
    at = cursor(store).cursor
    with store.pool.connection() as conn:
        # A run that fenced tenant A and died: its fence stays, its run is no longer running.
        run_id = run_rows.start_run(
            conn,
            stream_catalogue.name,
            "rebuild",
            trigger="t",
            actor="t",
            owner="gone",
            start=at,
            target=None,
            tenant=A,
        )
        conn.execute(
            "INSERT INTO ledgerflow.projection_tenant_fences VALUES (%s, %s, %s, %s, %s)",
            (stream_catalogue.name, A, run_id, at.transaction_id, at.position),
        )
        run_rows.finish_run(conn, run_id, "abandoned")
    store.append("s", [NewEvent("Seen", {})], tenant=A)
    store.append("s", [NewEvent("Seen", {})], tenant=B)
    catch_up(worker)
    assert fences(store) == []
    assert versions(store, A) == {"s": 2}
    assert verify(store, stream_catalogue).equal
    worker.release_all()


def count_rows(store: EventStore) -> dict[tuple[str, str], int]:
    with store.pool.connection() as conn:
        rows = conn.execute("SELECT tenant, stream_id, n FROM ledgerflow.tenant_event_counts").fetchall()
    return {(t, s): n for t, s, n in rows}


def waiting_on_locks(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_every_event_is_counted_once_across_a_tenant_rebuild_and_a_full_one(store: EventStore) -> None:
    for tenant in (A, B):
        store.append("s", [NewEvent("Seen", {}) for _ in range(3)], tenant=tenant)
    worker = ProjectorWorker(store, [counts])
    catch_up(worker)
    results: list[RebuildResult] = []

    def rebuilding(tenant: str | None) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: results.append(rebuild(store, counts, tenant=tenant)), daemon=True
        )
        thread.start()
        return thread

    holder = psycopg.connect(store.url, autocommit=False)
    try:
        holder.execute("SELECT 1 FROM ledgerflow.tenant_event_counts WHERE tenant = %s FOR UPDATE", (A,))
        tenant_rebuild = rebuilding(A)
        wait_until(lambda: fences(store) == [A], what="tenant A to be fenced")
        for tenant in (A, B, A):
            store.append("s", [NewEvent("Seen", {})], tenant=tenant)
        catch_up(worker)  # B's event counted; A's two are left for the lift
        assert count_rows(store)[(B, "s")] == 4
        # A server administrator's rebuild of every tenant meanwhile: its swap waits for A's replacement
        # (which waits for the held row), then puts A's rows at its own cursor and moves A's fence there.
        full_rebuild = rebuilding(None)
        wait_until(lambda: waiting_on_locks(store) >= 2, what="the full rebuild to wait for tenant A's")
    finally:
        holder.rollback()
        holder.close()
    for thread in (tenant_rebuild, full_rebuild):
        thread.join(30)
        assert not thread.is_alive()
    assert len(results) == 2
    assert fences(store) == []
    store.append("s", [NewEvent("Seen", {})], tenant=A)
    catch_up(worker)
    assert count_rows(store) == {(A, "s"): 6, (B, "s"): 4}
    assert verify(store, counts).equal
    worker.release_all()

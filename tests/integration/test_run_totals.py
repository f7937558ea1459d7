"""Operator runs count the events they go through when they start, so that progress can show a total,
a rate and the time left."""

from __future__ import annotations

from eventstore import Cursor, EventStore, NewEvent
from projector import ProjectionHealth, run_rows, start_rebuild, start_replay, start_verify, stream_catalogue
from tests.waiting import wait_until


def recorded(store: EventStore, run_id: int) -> run_rows.Run:
    with store.pool.connection() as conn:
        run = run_rows.get_run(conn, run_id)
    assert run is not None
    return run


def test_rebuild_verify_and_replay_count_what_they_go_through(store: EventStore) -> None:
    for i in range(30):
        store.append(f"order-{i}", [NewEvent("Placed", {"i": i}) for _ in range(5)], tenant="acme")
    for i in range(7):
        store.append(f"order-{i}", [NewEvent("Placed", {"i": i})], tenant="globex")
    wait_until(lambda: not store.events_beyond_horizon(), what="the events to be readable")

    rebuild = start_rebuild(store, stream_catalogue)
    assert recorded(store, rebuild.run_id).events_total == 157
    rebuild.execute()
    done = recorded(store, rebuild.run_id)
    assert (done.events_processed, done.seconds_left) == (157, None), "a finished run has no time left"

    tenant_verify = start_verify(store, stream_catalogue, tenant="globex")
    assert recorded(store, tenant_verify.run_id).events_total == 7
    tenant_verify.execute()

    # A page may come back empty (its horizon's transaction ended while it was read): read again.
    first_page = wait_until(lambda: store.read_all(Cursor(), limit=100).events, what="a first page")
    middle = first_page[-1].cursor
    replay = start_replay(store, stream_catalogue, after=middle)
    assert recorded(store, replay.run_id).events_total == 57
    replay.execute()


def test_the_time_left_follows_the_rate(store: EventStore) -> None:
    store.append("order-1", [NewEvent("Placed", {}) for _ in range(10)])
    wait_until(lambda: not store.events_beyond_horizon(), what="the events to be readable")
    run = start_rebuild(store, stream_catalogue)
    with store.pool.connection() as conn:
        # As if a quarter were done after two seconds: three quarters are left, six seconds at that rate.
        conn.execute(
            "UPDATE ledgerflow.projection_runs SET events_processed = 2, events_total = 8,"
            " started_at = heartbeat_at - interval '2 seconds' WHERE id = %s",
            (run.run_id,),
        )
    assert recorded(store, run.run_id).seconds_left == 6.0
    run.execute()


def test_lag_and_totals_count_only_the_types_a_projection_reads(store: EventStore) -> None:
    from projector.health import projection_health
    from workflows import workflow_tables

    rebuild = start_rebuild(store, workflow_tables)
    rebuild.execute()
    store.append("order-1", [NewEvent("Placed", {}) for _ in range(50)])

    def health() -> dict[str, ProjectionHealth]:
        return {h.name: h for h in projection_health(store, [stream_catalogue, workflow_tables])}

    # The horizon is conservative: a transaction of another database on the same server, running when a
    # look took its snapshot and ended before it read the locks, holds the horizon back for that look.
    # So the 50 are waited for; the workflow tables' lag is 0 at every look.
    wait_until(lambda: health()["stream_catalogue"].lag_events == 50, what="the events to be readable")
    assert health()["workflow_tables"].lag_events == 0, "no workflow event is waiting for it"
    verify = start_verify(store, workflow_tables)
    assert recorded(store, verify.run_id).events_total == 0
    verify.execute()

"""Leases last their TTL from the moment they are granted (migration 0034), however long the statement
that takes or renews one waited for the row first: a standby waiting behind the holder's open batch, a
heartbeat waiting behind its own node's fenced write."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg

from eventstore import EventStore
from projector import lease_rows
from tests.waiting import wait_until
from workflows import Engine, Workflow, WorkflowRegistry, queue_claims

TTL = 1.0


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def waiting_on_a_lock(store: EventStore, pid: int) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


def hold_longer_than_the_ttl(
    store: EventStore, holder: psycopg.Connection[Any], waiter_pid: int, *, commit: bool = True
) -> datetime:
    """Once the waiter waits on the holder's row lock, keep the holder's transaction open past a whole TTL
    (the point: a holder that is paused or cut off), then end it; returns when it ended."""
    wait_until(
        lambda: waiting_on_a_lock(store, waiter_pid), timeout=30, what="the waiter to wait on the lock"
    )
    began = db_now(holder)
    wait_until(
        lambda: db_now(holder) > began + timedelta(seconds=1.5 * TTL), timeout=30, what="a TTL to pass"
    )
    ended = db_now(holder)
    if commit:
        holder.commit()
    else:
        holder.rollback()
    return ended


def test_a_standby_that_waited_behind_the_holders_batch_longer_than_the_ttl_gets_a_whole_ttl(
    store: EventStore,
) -> None:
    with store.pool.connection() as conn:
        assert lease_rows.acquire_lease(conn, "counter", "holder", TTL) == 1
    result: list[int | None] = []
    with (
        psycopg.connect(store.url, autocommit=True) as standby,
        psycopg.connect(store.url) as holder,  # the holder's batch: a transaction of its own
    ):
        # As a batch does: FOR SHARE on the lease row until the batch commits (the idle timeout is the
        # batch's, set long here so that the test, not the server, ends it).
        assert lease_rows.hold_lease(holder, "counter", "holder", 1, ttl=30.0)
        waiter = threading.Thread(
            target=lambda: result.append(lease_rows.acquire_lease(standby, "counter", "standby", TTL))
        )
        waiter.start()
        committed = hold_longer_than_the_ttl(store, holder, standby.info.backend_pid)
        waiter.join(timeout=30)
    assert result == [2], "the standby takes the lapsed lease, with the next epoch"
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT owner, acquired_at, expires_at, expires_at > clock_timestamp() "
            "FROM ledgerflow.projection_leases WHERE projection = 'counter'"
        ).fetchone()
    assert row is not None
    owner, acquired_at, expires_at, alive = row
    assert owner == "standby"
    assert acquired_at >= committed, "granted once the holder's batch let go of the row"
    # A TTL from the grant (the two columns are two reads of the clock in one statement, a microsecond or
    # so apart), not from the statement's start, which lies more than a TTL before it here.
    assert timedelta(seconds=TTL) <= expires_at - acquired_at < timedelta(seconds=TTL, milliseconds=1)
    assert alive, "the lease it was just granted has not lapsed"


def test_a_projection_renewal_that_waited_past_its_lease_does_not_bring_it_back(store: EventStore) -> None:
    with store.pool.connection() as conn:
        assert lease_rows.acquire_lease(conn, "counter", "holder", TTL) == 1
    renewed: list[bool] = []
    with psycopg.connect(store.url, autocommit=True) as beat, psycopg.connect(store.url) as batch:
        assert lease_rows.hold_lease(batch, "counter", "holder", 1, ttl=30.0)
        waiter = threading.Thread(
            target=lambda: renewed.append(lease_rows.renew_lease(beat, "counter", "holder", 1, TTL))
        )
        waiter.start()
        hold_longer_than_the_ttl(store, batch, beat.info.backend_pid)
        waiter.join(timeout=30)
    assert renewed == [False], "the lease lapsed while the renewal waited: it is lost, not renewed"
    with store.pool.connection() as conn:
        assert lease_rows.acquire_lease(conn, "counter", "standby", TTL) == 2


def test_a_node_heartbeat_counts_its_lease_from_when_it_got_the_row(store: EventStore) -> None:
    registry = WorkflowRegistry()
    flow = Workflow("one")

    @flow.node()
    def only(ctx: object) -> None:
        return None

    registry.register(flow)
    engine = Engine(store, registry)
    run_id = engine.start("one").run_id
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT * FROM ledgerflow.wf_claim('w', 'inst', 'w/inst', ARRAY['one'], "
            "ARRAY[(SELECT version FROM ledgerflow.workflow_queue WHERE run_id = %s)], 1, %s)",
            (run_id, 30.0),
        ).fetchone()
    assert row is not None
    token = row[5]
    alive: list[set[int]] = []
    with psycopg.connect(store.url, autocommit=True) as beat, psycopg.connect(store.url) as write:
        # The node's own fenced write, open (its client paused): it holds the queue row until the server
        # ends it (rolled back), as the idle timeout does.
        write.execute("SELECT ledgerflow.wf_fence(%s, 'only', %s, false)", (run_id, token))
        waiter = threading.Thread(
            target=lambda: alive.append(queue_claims.heartbeat(beat, "inst", [token], 30.0))
        )
        waiter.start()
        ended = hold_longer_than_the_ttl(store, write, beat.info.backend_pid, commit=False)
        waiter.join(timeout=30)
    assert alive == [{token}]
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT heartbeat_at, lease_expires_at FROM ledgerflow.workflow_queue WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    assert row[0] >= ended, "renewed once the write let go of the row"
    assert timedelta(seconds=30.0) <= row[1] - row[0] < timedelta(seconds=30.0, milliseconds=1)

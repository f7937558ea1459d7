"""The hot path's writes are stamped without a subtransaction.

A transaction that appends to the log is stamped (`events.transaction_id`, ledgerflow.log_writer) with an
xid handed out after it took the log writer lock. One that had an xid before the lock is stamped with a
subtransaction's xid: the events' transaction_id then differs from the xid that wrote their rows (their
xmin). A claim, a node's end and the end of a run take the lock before their first write, so the two are
the same. A claim that finds nothing takes no xid at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from eventstore import DatabaseSettings, EventStore, open_store
from tests.flows import registry
from workflows import Engine, WorkerSettings, WorkflowWorker, queue_node_ends
from workflows import events as ev
from workflows.queue_claims import Claim

SETTINGS = WorkerSettings(concurrency=2, lease_ttl=30)

# The xid that wrote each event's row, and the stamp the event carries (both as 32-bit xids).
STAMPS = """
SELECT event_type, xmin::text::bigint, transaction_id::text::bigint %% 4294967296
  FROM ledgerflow.events
 WHERE tenant = 'default' AND stream_id = %(stream)s
 ORDER BY stream_version
"""


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    with open_store(DatabaseSettings(pool_min_size=1, pool_max_size=2), url=database_url, migrate=False) as s:
        yield s


def stamps(store: EventStore, run_id: uuid.UUID) -> list[tuple[str, int, int]]:
    with store.pool.connection() as conn:
        return [(t, int(x), int(s)) for t, x, s in conn.execute(STAMPS, {"stream": ev.run_stream(run_id)})]


def test_claims_node_ends_and_run_ends_stamp_their_events_with_their_own_xid(store: EventStore) -> None:
    engine = Engine(store, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="stamps")
    wf = registry.get("linear")
    run_id = engine.start("linear", input={"n": 1}).run_id
    waiting = engine.start("linear").run_id
    (claim,) = worker._claim(1)  # the claim loop's claim: the queue is written first, then NodeClaimed
    assert claim.run_id == run_id
    run = engine.load(run_id)
    held: Claim | None = claim
    for output in ({"n": 1}, {"n": 2}, {"n": 3}):
        assert held is not None
        held = worker.lifecycle.succeeded(held, wf, output, 0.001, claim_next=worker._claimant, run=run)
    assert run.status == "succeeded"
    assert held is not None
    assert held.run_id == waiting  # claimed by the end of the first run

    recorded = stamps(store, run_id) + stamps(store, waiting)
    kinds = {t for t, _, _ in recorded}
    assert {ev.NODE_CLAIMED, ev.NODE_SUCCEEDED, ev.RUN_COMPLETED} <= kinds
    late = [(t, xmin, stamp) for t, xmin, stamp in recorded if xmin != stamp]
    assert late == [], "events stamped by a subtransaction's xid, not their own transaction's"


def test_a_claim_that_finds_nothing_takes_no_xid(store: EventStore) -> None:
    with store.pool.connection() as conn:
        conn.execute("BEGIN")
        try:
            conn.execute(
                "SELECT count(*) FROM ledgerflow.wf_claim('idle', 'i', 'idle/i', ARRAY['linear'], "
                "ARRAY[%s], 8, 30)",
                (registry.versions("linear")[0],),
            )
            row = conn.execute("SELECT pg_current_xact_id_if_assigned() IS NULL").fetchone()
            assert row == (True,)
        finally:
            conn.execute("ROLLBACK")


def test_a_claim_in_a_transaction_that_already_wrote_is_still_stamped_after_the_lock(
    store: EventStore,
) -> None:
    """A transaction with an xid from before the claim: the claim cannot stamp with that xid (a reader
    may have passed it while it held no lock), so it takes the late stamp, as before."""
    engine = Engine(store, registry)
    run_id = engine.start("linear").run_id
    with store.pool.connection() as conn:
        conn.execute("BEGIN")
        try:
            row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
            assert row is not None
            top = int(row[0])
            conn.execute(
                "SELECT count(*)"
                " FROM ledgerflow.wf_claim('w', 'i', 'w/i', ARRAY['linear'], ARRAY[%s], 8, 30)",
                (registry.versions("linear")[0],),
            )
            row = conn.execute(
                "SELECT transaction_id::text::bigint FROM ledgerflow.events"
                " WHERE tenant = 'default' AND stream_id = %s AND event_type = %s",
                (ev.run_stream(run_id), ev.NODE_CLAIMED),
            ).fetchone()
            assert row is not None
            assert int(row[0]) > top
        finally:
            conn.execute("ROLLBACK")


def test_a_node_end_queues_its_successor_with_the_run_s_priority_without_reading_the_log(
    store: EventStore,
) -> None:
    """The successor takes the ending node's priority (migration 0044); the queue's priority trigger, which
    reads the run's RunStarted from the log, is not called on the way."""
    engine = Engine(store, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="priority")
    wf = registry.get("linear")
    run_id = engine.start("linear", input={"n": 1}, priority=7).run_id
    (claim,) = worker._claim(1)
    assert claim.node == "first"
    with store.pool.connection() as conn:
        conn.execute("SET track_functions = 'all'")
        conn.execute("BEGIN")
        try:
            # The node's end statement in a transaction of this test's own, so that its function calls
            # can be counted before it ends (pg_stat_get_xact_function_calls).
            queue_node_ends.end_node(conn, claim, ready=[wf.nodes["second"]])()
            row = conn.execute(
                "SELECT priority FROM ledgerflow.workflow_queue WHERE run_id = %s AND node = 'second'",
                (run_id,),
            ).fetchone()
            assert row == (7,)
            calls = conn.execute(
                "SELECT coalesce(pg_stat_get_xact_function_calls('ledgerflow.wf_run_priority'::regproc), 0)"
            ).fetchone()
            assert calls == (0,)
        finally:
            conn.execute("ROLLBACK")
            conn.execute("RESET track_functions")

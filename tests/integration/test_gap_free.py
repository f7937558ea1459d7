"""Gap-free reading of the global log: no reader skips an event that commits after one it has seen.

The harness runs concurrent writers that hold their transactions open for a random while before
committing, so commits land out of position order, and readers that tail the log meanwhile. It is
also run with a naive `position > last` reader to show that it catches a skipping reader.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest

from eventstore import START, Cursor, EventStore, NewEvent, StreamAppend, open_store
from eventstore.settings import DatabaseSettings
from eventstore.sqlfile import load_queries
from tests.waiting import joined, wait_until

WRITERS = 8
TRANSACTIONS_PER_WRITER = 30

# A reader step: from its state, the next event ids it saw and its new state.
ReadStep = Callable[[EventStore, object], tuple[list[uuid.UUID], object]]


def gap_free_step(store: EventStore, state: object) -> tuple[list[uuid.UUID], object]:
    assert isinstance(state, Cursor)
    page = store.read_all(state, limit=100)
    return [e.event_id for e in page.events], page.cursor


def naive_step(store: EventStore, state: object) -> tuple[list[uuid.UUID], object]:
    assert isinstance(state, int)
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT position, event_id FROM ledgerflow.events "
            "WHERE position > %s ORDER BY position LIMIT 100",
            (state,),
        ).fetchall()
    return [r[1] for r in rows], (rows[-1][0] if rows else state)


@dataclass
class Outcome:
    committed: set[uuid.UUID] = field(default_factory=set)
    seen: list[list[uuid.UUID]] = field(default_factory=list)


def run_writers_and_readers(database_url: str, step: ReadStep, start: object, readers: int = 2) -> Outcome:
    settings = DatabaseSettings(pool_max_size=WRITERS + readers + 2)
    outcome = Outcome(seen=[[] for _ in range(readers)])
    lock = threading.Lock()
    writers_done = threading.Event()
    final: list[Cursor] = []
    errors: list[BaseException] = []

    with open_store(settings, url=database_url, migrate=False) as store:

        def write(worker: int) -> None:
            rng = random.Random(worker)
            try:
                with psycopg.connect(database_url) as conn:
                    for i in range(TRANSACTIONS_PER_WRITER):
                        events = [NewEvent("Tick", {"w": worker, "i": i}) for _ in range(rng.randint(1, 3))]
                        with conn.transaction():
                            store.append(f"w{worker}-{i % 4}", events, conn=conn)
                            # Hold the transaction open: others with later positions commit first.
                            time.sleep(rng.uniform(0, 0.004))
                        with lock:
                            outcome.committed.update(e.event_id for e in events)
            except BaseException as exc:
                errors.append(exc)

        def read(index: int) -> None:
            state = start
            try:
                while True:
                    finishing = writers_done.is_set()
                    ids, state = step(store, state)
                    outcome.seen[index].extend(ids)
                    # Done once nothing is left: for a cursor reader, once it passed every commit made
                    # before the writers finished (other transactions may hold the horizon a while).
                    if finishing and not ids and (not isinstance(state, Cursor) or state >= final[0]):
                        return
                    if not ids:
                        time.sleep(0.001)  # poll interval of a tailing reader, not a synchronisation
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
        tails = [threading.Thread(target=read, args=(r,)) for r in range(readers)]
        for t in threads + tails:
            t.start()
        for t in threads:
            joined(t)
        final.append(store.committed_so_far())
        writers_done.set()
        for t in tails:
            joined(t)
    assert not errors, errors
    return outcome


def test_every_reader_sees_every_committed_event_once_in_one_order(database_url: str) -> None:
    outcome = run_writers_and_readers(database_url, gap_free_step, START)
    assert len(outcome.committed) >= WRITERS * TRANSACTIONS_PER_WRITER
    for seen in outcome.seen:
        assert len(seen) == len(set(seen)), "a reader saw an event twice"
        assert set(seen) == outcome.committed, f"missed {len(outcome.committed - set(seen))} events"
    assert outcome.seen[0] == outcome.seen[1], "readers disagree on the order"


def test_the_harness_catches_a_naive_position_reader(database_url: str) -> None:
    outcome = run_writers_and_readers(database_url, naive_step, 0)
    missed = [outcome.committed - set(seen) for seen in outcome.seen]
    assert any(missed), "the naive reader skipped nothing: the harness could not catch a skipping reader"


def test_an_event_committing_late_is_not_skipped(store: EventStore) -> None:
    with psycopg.connect(store.url) as slow:
        slow_tx = slow.transaction()
        slow_tx.__enter__()
        early = store.append("slow", [NewEvent("Slow", {})], conn=slow).events[0].position
        late = store.append("fast", [NewEvent("Fast", {})]).events[0].position
        assert early < late

        # A naive reader would now see `late` and move past `early` for ever. (A page is not caught up
        # when some other transaction of the server ended at the horizon while it was read: read again.)
        page = wait_until(lambda: (p := store.read_all(START)).caught_up and p, what="a caught-up page")
        assert page.events == ()
        slow_tx.__exit__(None, None, None)

    # Both are readable once every older transaction in the cluster has finished.
    after = wait_until(lambda: store.read_all(page.cursor).events, what="the two events to become readable")
    assert [e.position for e in after] == [early, late]


def test_read_all_pages_resume_without_loss(store: EventStore) -> None:
    for i in range(25):
        store.append(f"s-{i % 5}", [NewEvent("T", {"i": i})])
    seen: list[int] = []
    cursor = START
    target = store.committed_so_far()
    while cursor < target:  # until this reader has passed every event committed before it started
        page = store.read_all(cursor, limit=7)
        seen.extend(e.data["i"] for e in page.events)
        cursor = page.cursor
    assert seen == list(range(25))


def test_read_all_filters_by_type_category_and_tenant(store: EventStore) -> None:
    store.append("order-1", [NewEvent("Placed", {}), NewEvent("Paid", {})])
    store.append("user-1", [NewEvent("Placed", {})])
    store.append("order-2", [NewEvent("Placed", {})], tenant="other")
    target = store.committed_so_far()
    page = wait_until(
        lambda: (
            (p := store.read_all(START, types=["Placed"], categories=["order"], tenant="default")).cursor
            >= target
            and p.caught_up
            and p
        ),
        what="the reader to pass the appended events and be caught up",
    )
    assert [(e.stream_id, e.type) for e in page.events] == [("order-1", "Placed")]
    # The cursor moves past what the filter left out, so the next read does not scan it again.
    assert store.read_all(page.cursor).events == ()


def test_horizon_names_the_transaction_holding_it_back(store: EventStore) -> None:
    with (
        psycopg.connect(store.url, application_name="slow-report") as report,
        report.transaction(),
        psycopg.connect(store.url, application_name="slow-writer") as slow,
        slow.transaction(),
    ):
        # A transaction that holds an xid but does not write to the log holds nothing back.
        report.execute("SELECT pg_current_xact_id()")
        store.append("slow", [NewEvent("T", {})], conn=slow)
        store.append("s", [NewEvent("T", {})])
        horizon = store.horizon()
        assert {h.application for h in horizon.holders} == {"slow-writer"}
        assert horizon.waiting_events == 1
        assert store.events_beyond_horizon()
    wait_until(lambda: store.horizon().waiting_events == 0, what="the horizon to pass the event")


@pytest.mark.parametrize("backward", [False, True])
def test_read_stream_from_a_version(store: EventStore, backward: bool) -> None:
    store.append("s", [NewEvent("T", {"v": v}) for v in range(1, 11)])
    got = store.read_stream("s", from_version=4, backward=backward, limit=3)
    assert [e.stream_version for e in got] == ([4, 3, 2] if backward else [4, 5, 6])
    newest = store.read_stream("s", backward=True, limit=1)
    assert newest[0].stream_version == 10


def test_the_horizon_check_reads_no_partition_of_the_log_through(store: EventStore) -> None:
    """Idle projectors and subscribers ask whether events wait beyond the horizon every few milliseconds
    while writers run: the answer comes from the end of an index, never from a scan of the log (a scan
    grows with the log: 117 ms at 371,000 events)."""
    for batch in range(20):
        store.append_many([StreamAppend(f"s-{batch}-{i}", [NewEvent("T", {"i": i})]) for i in range(100)])
    check = load_queries("eventstore")["events_beyond_horizon"]
    with psycopg.connect(store.url) as conn, conn.transaction():
        conn.execute("ANALYZE ledgerflow.events")
        with psycopg.connect(store.url) as slow, slow.transaction():
            store.append("slow", [NewEvent("T", {})], conn=slow)
            store.append("after", [NewEvent("T", {})])
            assert conn.execute(check).fetchone() == (True,)
        # Sequential scans of each partition by this transaction so far (the ANALYZE counts none).
        scans = conn.execute(
            "SELECT coalesce(sum(pg_stat_get_xact_numscans(c.oid)), 0) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'ledgerflow.events'::regclass"
        ).fetchone()
        assert scans == (0,)

"""The log's safe horizon waits for writers of the log only (migration 0013).

A transaction that appends holds readers of the global log back for exactly as long as it runs; one that
does not write to the log, in this database or another of the server, holds nothing back; and one that
wrote something else before it appends (a late writer, which readers may already have passed) is still
never skipped. Checked one case at a time, under concurrent writers and readers, as a hypothesis
property over interleavings of sessions, and with a writer killed by SIGKILL mid-transaction.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import START, Cursor, EventStore, NewEvent, StreamAppend, open_store
from eventstore.events import AppendedEvent
from eventstore.settings import DatabaseSettings
from tests.waiting import joined, wait_until


def read_to_end(store: EventStore, after: Cursor = START, **filters: Any) -> tuple[list[int], Cursor]:
    """The positions of every event readable now after `after`, in read order, and where to resume."""
    seen: list[int] = []
    while True:
        page = store.read_all(after, limit=500, **filters)
        seen.extend(e.position for e in page.events)
        after = page.cursor
        if page.caught_up:
            return seen, after


def read_past(store: EventStore, after: Cursor, target: Cursor, **filters: Any) -> tuple[list[int], Cursor]:
    """Read from `after` until the cursor reaches `target`; the positions read, and where to resume.

    A transaction of the server that ends just while a read computes its horizon holds that one read back
    (it may have been a writer that committed meanwhile: see ledgerflow.log_holders); the next read passes
    it. So "readable" means "read within a few attempts", while whatever must not hold readers stays open.
    """
    seen: list[int] = []

    def step() -> bool:
        nonlocal after
        more, after = read_to_end(store, after, **filters)
        seen.extend(more)
        return after >= target

    wait_until(step, timeout=10, what=f"a reader to pass {target}")
    return seen, after


def past(event: AppendedEvent) -> Cursor:
    """The first cursor beyond `event`."""
    return Cursor(event.transaction_id, event.position + 1)


def holder_pids(store: EventStore) -> list[int]:
    return [h.pid for h in store.horizon().holders]


def xid_of(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture(autouse=True)
def side_work(database_url: str) -> None:
    """A table beside the log, for transactions that write something else."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.side_work (n int)")


def write_something_else(conn: psycopg.Connection[Any]) -> int:
    """Make `conn`'s transaction write outside the log (it gets an xid); return the xid."""
    conn.execute("INSERT INTO public.side_work VALUES (1)")
    return xid_of(conn)


# -- one case at a time ------------------------------------------------------------------------------------


def test_a_slow_appender_holds_readers_back_exactly_until_it_ends(store: EventStore) -> None:
    with psycopg.connect(store.url, application_name="slow-writer") as slow:
        with slow.transaction():
            early = store.append("slow", [NewEvent("Slow", {})], conn=slow).events[0]
            late = store.append("fast", [NewEvent("Fast", {})]).events[0]
            assert early.position < late.position
            # Held back while it runs: the later event committed, but a reader taking it would move
            # past the slow writer's event for ever.
            seen, cursor = read_to_end(store)
            assert seen == []
            assert cursor < Cursor(early.transaction_id, early.position)
            horizon = wait_until(
                lambda: (h := store.horizon()).xmin == early.transaction_id and h, what="the writer's horizon"
            )
            assert [h.pid for h in horizon.holders] == [slow.info.backend_pid]
            assert horizon.waiting_events == 1
            third = store.append("fast", [NewEvent("Fast", {})]).events[0]
            assert read_to_end(store, cursor)[0] == []
        # And no longer: once it has committed, readers read it, then what waited behind it, in log order.
        seen, _ = read_past(store, cursor, past(third))
    assert seen == [early.position, late.position, third.position]
    wait_until(lambda: holder_pids(store) == [], what="no writer to hold the horizon")


@pytest.mark.parametrize("where", ["another database", "this database"])
def test_a_transaction_that_does_not_write_the_log_holds_no_reader_back(
    store: EventStore, admin_url: str, where: str
) -> None:
    url = admin_url if where == "another database" else store.url
    with psycopg.connect(url, application_name="unrelated-report") as other, other.transaction():
        if where == "this database":
            write_something_else(other)  # a long transaction of the same application, beside the log
        else:
            xid_of(other)  # an xid, as a CREATE DATABASE or a report that writes would hold
        appended = store.append("s", [NewEvent("T", {})]).events[0]
        # Readable while the other transaction stays open.
        seen, _ = read_past(store, START, past(appended))
        assert seen == [appended.position]
        wait_until(
            lambda: (h := store.horizon()).holders == () and h.waiting_events == 0,
            what="a horizon that no one holds",
        )
        wait_until(lambda: not store.events_beyond_horizon(), what="no event beyond the horizon")


def late_appends(store: EventStore, stream: str) -> dict[str, Callable[[psycopg.Connection[Any]], Any]]:
    """Every append statement, made inside a caller's transaction."""

    def new(n: int = 1) -> list[NewEvent]:
        return [NewEvent("Late", {}) for _ in range(n)]

    return {
        "one event": lambda c: store.append(stream, new(), conn=c),
        "one stream": lambda c: store.append(stream, new(3), conn=c),
        "several streams": lambda c: store.append_many(
            [StreamAppend(stream, new()), StreamAppend(f"{stream}b", new())], conn=c
        ),
        "idempotency key": lambda c: store.append(stream, new(), idempotency_key=stream, conn=c),
    }


@pytest.mark.parametrize("kind", ["one event", "one stream", "several streams", "idempotency key"])
def test_a_writer_that_wrote_something_else_first_is_never_skipped(store: EventStore, kind: str) -> None:
    with psycopg.connect(store.url) as late_conn:
        with late_conn.transaction():
            xid = write_something_else(late_conn)
            first = store.append("fast", [NewEvent("Fast", {})]).events[0]
            # Not a writer of the log yet: readers pass it.
            seen, cursor = read_past(store, START, Cursor(xid + 1, 0))
            assert seen == [first.position]
            result = late_appends(store, "late")[kind](late_conn)
            # Its events carry a stamp beyond every horizon a reader may already have passed...
            stamps = {e.transaction_id for e in result.events}
            assert len(stamps) == 1
            assert min(stamps) >= cursor.transaction_id
            # ... held by the writer lock until it ends, and kept for the transaction's later appends.
            pid = late_conn.info.backend_pid
            wait_until(lambda: holder_pids(store) == [pid], what="the late writer to hold the horizon")
            again = store.append("late-again", [NewEvent("Late", {})], conn=late_conn)
            assert {e.transaction_id for e in again.events} == stamps
            assert read_to_end(store, cursor)[0] == []
        written = sorted([*result.events, *again.events], key=lambda e: e.position)
        seen, _ = read_past(store, cursor, past(written[-1]))
    # One stamp: in position order.
    assert seen == [e.position for e in written]


def test_a_rolled_back_savepoint_gives_up_the_writer_lock_and_the_stamp(store: EventStore) -> None:
    with psycopg.connect(store.url) as conn:
        with conn.transaction():
            xid = write_something_else(conn)
            with conn.transaction() as savepoint:
                store.append("gone", [NewEvent("Gone", {})], conn=conn)
                raise psycopg.Rollback(savepoint)
            # No writer any more: readers pass it again.
            fast = store.append("fast", [NewEvent("Fast", {})]).events[0]
            seen, cursor = read_past(store, START, Cursor(xid + 1, 0))
            assert seen == [fast.position]
            kept = store.append("kept", [NewEvent("Kept", {})], conn=conn).events[0]
            assert kept.transaction_id >= cursor.transaction_id
        seen, _ = read_past(store, cursor, past(kept))
    assert seen == [kept.position]


# -- under concurrency -------------------------------------------------------------------------------------

WRITERS = 6
TRANSACTIONS_PER_WRITER = 25


def test_late_and_early_writers_and_unrelated_transactions_under_concurrency(database_url: str) -> None:
    """Writers that append first, writers that write elsewhere first, and transactions that never touch
    the log, all holding their transactions open for a random while; readers tail meanwhile. Every
    reader sees every committed event once, in one order."""
    committed: set[uuid.UUID] = set()
    seen: list[list[uuid.UUID]] = [[], []]
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []
    final: list[Cursor] = []

    with open_store(DatabaseSettings(pool_max_size=WRITERS + 6), url=database_url, migrate=False) as store:

        def write(worker: int) -> None:
            rng = random.Random(worker)
            try:
                with psycopg.connect(database_url) as conn:
                    for i in range(TRANSACTIONS_PER_WRITER):
                        events = [NewEvent("Tick", {"w": worker, "i": i}) for _ in range(rng.randint(1, 3))]
                        with conn.transaction():
                            if worker % 3 == 1:
                                write_something_else(conn)  # a late writer
                            if worker % 3 == 2:
                                write_something_else(conn)
                                # Open a while without touching the log, not a synchronisation.
                                time.sleep(rng.uniform(0, 0.004))
                                continue
                            store.append(f"w{worker}-{i % 4}", events, conn=conn)
                            # Hold the transaction open: others with later positions commit first.
                            time.sleep(rng.uniform(0, 0.004))
                        with lock:
                            committed.update(e.event_id for e in events)
            except BaseException as exc:
                errors.append(exc)

        def read(index: int) -> None:
            cursor = START
            try:
                while True:
                    finishing = done.is_set()
                    page = store.read_all(cursor, limit=100)
                    seen[index].extend(e.event_id for e in page.events)
                    cursor = page.cursor
                    if finishing and not page.events and cursor >= final[0]:
                        return
                    if not page.events:
                        time.sleep(0.001)  # poll interval of a tailing reader, not a synchronisation
            except BaseException as exc:
                errors.append(exc)

        writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
        readers = [threading.Thread(target=read, args=(r,)) for r in range(2)]
        for t in writers + readers:
            t.start()
        for t in writers:
            joined(t)
        final.append(store.committed_so_far())
        done.set()
        for t in readers:
            t.join(timeout=60)
    assert not errors, errors
    for one in seen:
        assert len(one) == len(set(one)), "a reader saw an event twice"
        assert set(one) == committed, f"missed {len(committed - set(one))} events"
    assert seen[0] == seen[1], "readers disagree on the order"


# -- a property over interleavings of sessions ---------------------------------------------------------------

SESSIONS = 3

# A step: (action, session). Sessions are connections with implicit transactions: the first statement
# after a commit begins the next one.
steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["append", "append", "unrelated", "commit", "commit", "rollback", "autocommit", "read"]
        ),
        st.integers(min_value=0, max_value=SESSIONS - 1),
    ),
    min_size=1,
    max_size=16,
)


@dataclass
class Session:
    conn: psycopg.Connection[Any]
    #: Positions of the events appended in the open transaction: it holds the writer lock if any.
    pending: list[int] = field(default_factory=list)


@contextmanager
def sessions(url: str) -> Iterator[list[Session]]:
    conns = [psycopg.connect(url) for _ in range(SESSIONS)]
    try:
        yield [Session(c) for c in conns]
    finally:
        for c in conns:
            c.close()


@given(script=steps)
@settings(max_examples=40)
def test_readers_see_every_committed_event_once_and_wait_only_for_open_writers(
    store: EventStore, script: list[tuple[str, int]]
) -> None:
    """Any interleaving of appends (first in their transaction or late), unrelated writes, commits and
    rollbacks: a reader never sees an event twice nor misses one, and whenever no session holds an
    append open, it has every committed event, whatever unrelated transactions stay open."""
    category = f"p{uuid.uuid4().hex[:12]}"
    committed: list[int] = []
    seen: list[int] = []
    cursor = START
    with sessions(store.url) as open_sessions:
        for n, (action, index) in enumerate(script + [("commit", i) for i in range(SESSIONS)]):
            s = open_sessions[index]
            if action == "append":
                appended = store.append(f"{category}-{index}", [NewEvent("P", {"n": n})], conn=s.conn)
                s.pending.append(appended.last_position)
            elif action == "unrelated":
                write_something_else(s.conn)
            elif action == "autocommit":
                committed.append(store.append(f"{category}-x", [NewEvent("P", {"n": n})]).last_position)
            elif action in ("commit", "rollback"):
                getattr(s.conn, action)()
                if action == "commit":
                    committed.extend(s.pending)
                s.pending = []
            more, cursor = read_to_end(store, cursor, categories=[category])
            seen.extend(more)
            if not any(x.pending for x in open_sessions):
                # No append open: nothing may hold the reader, whatever unrelated transactions stay open.
                def caught_up() -> bool:
                    nonlocal cursor
                    more, cursor = read_to_end(store, cursor, categories=[category])
                    seen.extend(more)
                    return set(seen) >= set(committed)

                wait_until(caught_up, timeout=10, what="the reader to read every committed event")
            assert len(seen) == len(set(seen)), "an event was read twice"
            assert set(seen) <= set(committed)
    # Another reader, from the start, reads the same events in the same order.
    assert read_to_end(store, categories=[category])[0] == seen


# -- a writer killed mid-transaction ---------------------------------------------------------------------

_KILLED_WRITER = """
import sys, time, psycopg
from eventstore import NewEvent, open_store
url, late = sys.argv[1], sys.argv[2] == "late"
with open_store(url=url, migrate=False) as store, psycopg.connect(url) as conn:
    if late:
        conn.execute("CREATE TABLE IF NOT EXISTS public.side_work (n int)")
        conn.execute("INSERT INTO public.side_work VALUES (1)")
    store.append("doomed", [NewEvent("Doomed", {})], conn=conn)
    print("PID", conn.info.backend_pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("late", [False, True], ids=["appends first", "wrote something else first"])
def test_a_writer_killed_mid_transaction_releases_the_horizon(store: EventStore, late: bool) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, store.url, "late" if late else "early"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        line = ""
        while not line.startswith("PID "):  # after the store's log lines
            line = writer.stdout.readline()
            assert line, "the writer ended before it appended"
        pid = int(line.split()[1])
        kept = store.append("kept", [NewEvent("Kept", {})]).events[0]
        wait_until(lambda: holder_pids(store) == [pid], what="the writer to hold the horizon")
        assert read_to_end(store)[0] == []
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        # Its session ends with the process, and the transaction with it: readers go on, and the
        # doomed event never appears.
        seen = wait_until(lambda: read_to_end(store)[0], what="the horizon to pass the killed writer")
        assert seen == [kept.position]
        wait_until(lambda: holder_pids(store) == [], what="no writer to hold the horizon")
    finally:
        writer.kill()
        writer.wait(timeout=30)
        if writer.stdout is not None:
            writer.stdout.close()

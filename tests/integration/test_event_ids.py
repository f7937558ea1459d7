"""Event ids are unique within a tenant's log, whatever writes it and however appends race.

The guarantee lives in ledgerflow.event_ids, claimed once per statement (migrations/0040); these tests
hold it against every writing path and against concurrent appends under READ COMMITTED.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from eventstore import NO_STREAM, EventStore, NewEvent, StreamAppend, WrongExpectedVersionError
from eventstore.errors import DuplicateEventIdError
from tests.waiting import joined, wait_until


def ev(event_id: uuid.UUID | None = None) -> NewEvent:
    return NewEvent("Happened", {}, event_id=event_id) if event_id else NewEvent("Happened", {})


def count_events(store: EventStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert row is not None
    return int(row[0])


def waiting_on_a_lock(store: EventStore, pid: int) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


class Racer(threading.Thread):
    """Appends `events` on a connection of its own, remembering its result or error."""

    def __init__(self, store: EventStore, stream: str, events: list[NewEvent], tenant: str) -> None:
        super().__init__(name=f"append-{stream}", daemon=True)
        self.conn = psycopg.connect(store.url, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.store, self.stream, self.events, self.tenant = store, stream, events, tenant
        self.error: BaseException | None = None
        self.positions: list[int] = []

    def run(self) -> None:
        try:
            result = self.store.append(self.stream, self.events, tenant=self.tenant, conn=self.conn)
            self.positions = [e.position for e in result.events]
        except BaseException as exc:  # kept for the test's thread to assert on
            self.error = exc
        finally:
            self.conn.close()


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
@pytest.mark.parametrize("size", [1, 3], ids=["one-event", "batch"])
def test_two_appends_racing_for_one_id_exactly_one_commits_it(
    store: EventStore, first_commits: bool, size: int
) -> None:
    taken = uuid.uuid4()
    first_events = [ev() for _ in range(size - 1)] + [ev(taken)]
    # The second append carries the id first, so the two claim it in different places of their batches.
    second_events = [ev(taken)] + [ev() for _ in range(size - 1)]
    with psycopg.connect(store.url) as first:  # READ COMMITTED, the default
        store.append("first", first_events, conn=first)
        second = Racer(store, "second", second_events, "default")
        second.start()
        # The second append has written its events and waits on the first one's claim of the id.
        wait_until(lambda: waiting_on_a_lock(store, second.pid), what="the second append to wait")
        if first_commits:
            first.commit()
        else:
            first.rollback()
        joined(second)
    if first_commits:
        assert isinstance(second.error, DuplicateEventIdError)
        assert isinstance(second.error.__cause__, psycopg.errors.UniqueViolation)
        assert [e.event_id for e in store.read_stream("first")] == [e.event_id for e in first_events]
        assert store.read_stream("second") == []
    else:
        assert second.error is None
        assert store.read_stream("first") == []
        assert [e.event_id for e in store.read_stream("second")] == [e.event_id for e in second_events]
    assert count_events(store) == size


def test_the_same_id_in_two_tenants_at_once_waits_for_nothing(store: EventStore) -> None:
    shared = uuid.uuid4()
    with psycopg.connect(store.url) as first:
        store.append("s", [ev(shared)], tenant="tenant-a", conn=first)
        # Not blocked by tenant-a's uncommitted claim: joined() fails if it waits.
        other = Racer(store, "s", [ev(shared)], "tenant-b")
        other.start()
        joined(other, timeout=30)
        assert other.error is None
        first.commit()
    assert count_events(store) == 2


def test_a_reused_id_within_one_append_writes_nothing(store: EventStore) -> None:
    twice = uuid.uuid4()
    with pytest.raises(DuplicateEventIdError):
        store.append("s", [ev(twice), ev(), ev(twice)])
    with pytest.raises(DuplicateEventIdError):
        store.append_many([StreamAppend("a", [ev(twice)]), StreamAppend("b", [ev(twice)])])
    assert count_events(store) == 0
    assert store.stream_version("s") is None


def test_an_import_with_a_taken_id_imports_nothing(store: EventStore) -> None:
    taken = uuid.uuid4()
    store.append("s", [ev(taken)])
    with pytest.raises(DuplicateEventIdError):
        store.import_events([("t", ev()), ("t", ev(taken)), ("u", ev())])
    assert count_events(store) == 1
    # Another tenant's import may use it.
    assert store.import_events([("t", ev(taken))], tenant="other") == 1


def test_a_plain_insert_with_a_taken_id_is_refused(store: EventStore) -> None:
    taken = uuid.uuid4()
    store.append("s", [ev(taken)])
    with psycopg.connect(store.url) as conn, pytest.raises(psycopg.errors.UniqueViolation) as raised:
        conn.execute(
            "INSERT INTO ledgerflow.events (tenant, stream_id, stream_version, event_id, event_type, data)"
            " VALUES ('default', 'elsewhere', 1, %s, 'Happened', '{}')",
            (taken,),
        )
    assert raised.value.diag.constraint_name == "events_tenant_event_id_unique"
    assert count_events(store) == 1


def test_an_idempotent_retry_with_its_event_ids_is_answered_not_refused(store: EventStore) -> None:
    events = [ev(uuid.uuid4()), ev(uuid.uuid4())]
    first = store.append("s", events, idempotency_key="k")
    again = store.append("s", events, idempotency_key="k")
    assert again.duplicate
    assert not first.duplicate
    assert [e.position for e in again.events] == [e.position for e in first.events]
    # The same ids without the key are a new append, and refused.
    with pytest.raises(DuplicateEventIdError):
        store.append("s", events)
    assert count_events(store) == 2


def test_an_append_refused_for_its_expected_version_takes_no_id(store: EventStore) -> None:
    """An append refused for its expected version writes no event, so its id is claimed by nothing: the
    append that gets the version right may use it."""
    kept = uuid.uuid4()
    store.append("s", [ev()])
    with pytest.raises(WrongExpectedVersionError):
        store.append("s", [ev(kept)], expected_version=NO_STREAM)
    with pytest.raises(WrongExpectedVersionError):
        store.append("s", [ev(kept)], expected_version=5)
    assert store.append("s", [ev(kept)], expected_version=1).versions == {"s": 2}


@pytest.mark.parametrize("holder_commits", [True, False], ids=["holder-commits", "holder-rolls-back"])
def test_a_one_event_append_waits_for_a_claim_in_flight_then_knows(
    store: EventStore, holder_commits: bool
) -> None:
    """A one-event append from a thread of its own (which pins a connection and sends through libpq,
    `eventstore.direct`; the race test above appends in the caller's transaction, through psycopg) waits
    for a transaction that holds a claim of the same id, then is refused if that one commits and lands if
    it rolls back."""
    taken = uuid.uuid4()
    outcome: list[object] = []
    with psycopg.connect(store.url) as holder:
        holder.execute("INSERT INTO ledgerflow.event_ids (tenant, event_id) VALUES ('default', %s)", (taken,))

        def append() -> None:
            try:
                outcome.append(store.append("s", [ev(taken)]))
            except BaseException as exc:  # kept for the test's thread to assert on
                outcome.append(exc)

        appender = threading.Thread(target=append, name="append-taken", daemon=True)
        appender.start()

        def waiting() -> bool:
            with store.pool.connection() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                ).fetchone()
            return row is not None and row[0] == 1

        wait_until(waiting, what="the append to wait for the claim in flight")
        if holder_commits:
            holder.commit()
        else:
            holder.rollback()
    joined(appender)
    (result,) = outcome
    if holder_commits:
        assert isinstance(result, DuplicateEventIdError)
        assert store.stream_version("s") is None
    else:
        assert not isinstance(result, BaseException)
        assert store.read_stream("s")[0].event_id == taken

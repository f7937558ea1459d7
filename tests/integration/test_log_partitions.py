"""The partitioned log: partitions made ahead of need, uniqueness across partitions, archive and restore.

Partitions here are 10 positions wide, so a few dozen events cross several of them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from structlog.testing import capture_logs

from eventstore import (
    NO_STREAM,
    START,
    ArchiveRefusedError,
    DatabaseSettings,
    EventStore,
    NewEvent,
    RecordedEvent,
    WrongExpectedVersionError,
    archive_partition,
    list_partitions,
    open_store,
    restore_partition,
)
from eventstore.errors import DuplicateEventIdError, LedgerflowError
from tests.narrow_partitions import narrow_partitions
from tests.waiting import joined, wait_until

_SIZE = 10


@pytest.fixture
def small_store(database_url: str) -> Iterator[EventStore]:
    """A store on an empty log whose partitions are 10 positions wide."""
    narrow_partitions(database_url, _SIZE)
    with open_store(url=database_url) as store:
        yield store


def _all(store: EventStore) -> list[RecordedEvent]:
    """Every event committed so far, in resume order: read on until the cursor passes everything that had
    committed when the call began (the horizon may lag behind for a moment, never for good)."""
    target = store.committed_so_far()
    out: list[RecordedEvent] = []
    cursor = START

    def read_on() -> bool:
        nonlocal cursor
        while (page := store.read_all(cursor, limit=7)).events:
            out.extend(page.events)
            cursor = page.cursor
        cursor = page.cursor
        return not cursor < target

    wait_until(read_on, what="the log to be read to its end")
    return out


def _partitions(store: EventStore) -> dict[str, tuple[int, int, str]]:
    with store.pool.connection() as conn:
        return {p.name: (p.from_position, p.to_position, p.state) for p in list_partitions(conn)}


def test_appends_cross_partitions_and_read_back_whole(small_store: EventStore) -> None:
    store = small_store
    for i in range(12):
        store.append(f"order-{i % 3}", [NewEvent("Placed", {"i": i})])
    # A batch wider than the partition kept ahead: the store makes room and sends it again.
    store.append("order-0", [NewEvent("Batch", {"j": j}) for j in range(25)])
    store.import_events([(f"imported-{k % 2}", NewEvent("Imported", {"k": k})) for k in range(30)])
    events = _all(store)
    assert len(events) == 12 + 25 + 30
    # Every position has its partition, and one partition more is always there ahead of the appends.
    parts = _partitions(store)
    last = max(e.position for e in events)
    assert max(to for _, to, _ in parts.values()) > last + _SIZE - 1
    assert len(parts) >= 7
    # Streams read whole across partitions, versions 1..n with no gap.
    order_0 = store.read_stream("order-0")
    assert [e.stream_version for e in order_0] == list(range(1, 4 + 25 + 1))
    assert {e.position // _SIZE for e in order_0} != {order_0[0].position // _SIZE}


def test_uniqueness_holds_across_partitions(small_store: EventStore) -> None:
    store = small_store
    first = store.append("a-1", [NewEvent("E", {})], expected_version=NO_STREAM).events[0]
    taken = store.read_stream("a-1")[0].event_id
    for i in range(3 * _SIZE):  # the log moves on by several partitions
        store.append(f"b-{i}", [NewEvent("E", {})])
    with psycopg.connect(store.url) as conn:
        before = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    # An event id of an old partition is refused in a new one (same tenant), nothing written.
    with pytest.raises(DuplicateEventIdError):
        store.append("c-1", [NewEvent("E", {}, event_id=taken)])
    # Another tenant may use it: ids are unique within a tenant's log.
    store.append("c-1", [NewEvent("E", {}, event_id=taken)], tenant="other")
    # Versions: the stream's row refuses a stale expectation whatever partition its events are in.
    with pytest.raises(WrongExpectedVersionError):
        store.append("a-1", [NewEvent("E", {})], expected_version=NO_STREAM)
    with psycopg.connect(store.url) as conn:
        after = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone()
    assert after is not None
    assert before is not None
    assert after[0] == before[0] + 1
    assert first.stream_version == 1


def _append_from_threads(
    store: EventStore, writers: int, appends: int, stream: Callable[[int, int], str]
) -> None:
    """`writers` threads at once, each appending `appends` one-event appends, writer n's i-th to stream(n, i);
    every append must land."""
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(appends):
                store.append(stream(n, i), [NewEvent("W", {"n": n, "i": i})])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    assert errors == []


def test_concurrent_appends_across_partition_boundaries_keep_versions_unique(small_store: EventStore) -> None:
    store = small_store
    _append_from_threads(store, 4, 20, lambda n, i: f"shared-{i % 2}")
    for stream in ("shared-0", "shared-1"):
        assert [e.stream_version for e in store.read_stream(stream)] == list(range(1, 41))
    assert len({e.position for e in _all(store)}) == 80


def _fill(store: EventStore, n: int) -> None:
    for i in range(n):
        store.append(f"s-{i % 5}", [NewEvent("E", {"i": i, "text": "x\ny\t\\z ü"})])


def _cursor_at_end(store: EventStore, projection: str) -> None:
    events = _all(store)
    last = events[-1]
    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledgerflow.projection_cursors (projection, cursor_tx, cursor_position, version)"
            " VALUES (%s, %s, %s, 1) ON CONFLICT (projection) DO UPDATE"
            " SET cursor_tx = excluded.cursor_tx, cursor_position = excluded.cursor_position",
            (projection, last.transaction_id, last.position),
        )


def test_archive_is_refused_while_a_projection_has_not_read_the_partition(
    small_store: EventStore, tmp_path: Path
) -> None:
    store = small_store
    _fill(store, 25)
    _cursor_at_end(store, "done")
    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledgerflow.projection_cursors (projection, cursor_tx, cursor_position, version)"
            " VALUES ('lagging', 0, 3, 1)"
        )
    with pytest.raises(ArchiveRefusedError, match=r"lagging .*catch up"):
        archive_partition(store.url, "events_p000001", tmp_path)
    # The partition still receiving appends is refused too, whatever the cursors.
    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute("DELETE FROM ledgerflow.projection_cursors WHERE projection = 'lagging'")
    newest = max(_partitions(store).items(), key=lambda kv: kv[1][0])[0]
    with pytest.raises(ArchiveRefusedError, match="still receives appends"):
        archive_partition(store.url, newest, tmp_path)
    assert all(state == "attached" for _, _, state in _partitions(store).values())
    assert len(_all(store)) == 25


def test_archive_then_restore_gives_back_the_same_log(small_store: EventStore, tmp_path: Path) -> None:
    store = small_store
    _fill(store, 25)
    before = _all(store)
    _cursor_at_end(store, "caught_up")

    manifest = archive_partition(store.url, "events_p000001", tmp_path / "archive")
    files = sorted(p.name for p in (tmp_path / "archive").iterdir())
    assert files == ["events_p000001.copy", "events_p000001.manifest.json"]
    recorded = json.loads((tmp_path / "archive" / "events_p000001.manifest.json").read_text())
    assert (recorded["from_position"], recorded["to_position"]) == (1, 11)
    assert recorded["events"] == manifest.events == sum(1 for e in before if e.position < 11)
    assert _partitions(store)["events_p000001"][2] == "archived"
    # The rest of the log reads on, and appends go on.
    assert _all(store) == [e for e in before if e.position >= 11]
    store.append("s-new", [NewEvent("E", {})])
    # Its event ids are still taken while archived.
    with pytest.raises(DuplicateEventIdError):
        store.append("s-9", [NewEvent("E", {}, event_id=before[0].event_id)])
    with pytest.raises(ArchiveRefusedError, match="already archived"):
        archive_partition(store.url, "events_p000001", tmp_path / "again")

    restored = restore_partition(store.url, tmp_path / "archive" / "events_p000001.manifest.json")
    assert restored.state == "attached"
    after = _all(store)
    assert after[: len(before)] == before
    assert [e.stream_id for e in after[len(before) :]] == ["s-new"]
    with pytest.raises(ArchiveRefusedError, match="is attached"):
        restore_partition(store.url, tmp_path / "archive" / "events_p000001.manifest.json")


def test_a_partition_a_running_writer_wrote_into_is_not_archived(
    small_store: EventStore, tmp_path: Path
) -> None:
    """Refused while a transaction that wrote into the partition runs (every look sees it), archived once
    it has committed."""
    store = small_store
    _fill(store, 10)  # positions 1-10
    wait_until(lambda: "events_p000002" in _partitions(store), what="the partition ahead")
    with store.pool.connection() as conn, conn.transaction():
        store.append("open", [NewEvent("E", {"i": i}) for i in range(5)], conn=conn)  # 11-15, open
        wait_until(lambda: "events_p000003" in _partitions(store), what="the partition ahead")
        with open_store(url=store.url) as other:
            _fill(other, 10)  # 16-25: partition 2 (11-20) is full
            with pytest.raises(ArchiveRefusedError, match="transaction still running"):
                archive_partition(store.url, "events_p000002", tmp_path)
    _cursor_at_end(store, "caught_up")
    assert archive_partition(store.url, "events_p000002", tmp_path).events == 10


def test_a_damaged_archive_is_not_restored(small_store: EventStore, tmp_path: Path) -> None:
    store = small_store
    _fill(store, 25)
    _cursor_at_end(store, "caught_up")
    archive_partition(store.url, "events_p000002", tmp_path)
    data = tmp_path / "events_p000002.copy"
    data.write_bytes(data.read_bytes().replace(b"E", b"F", 1))
    with pytest.raises(ArchiveRefusedError, match="SHA-256"):
        restore_partition(store.url, tmp_path / "events_p000002.manifest.json")
    assert _partitions(store)["events_p000002"][2] == "archived"
    with psycopg.connect(store.url) as conn:
        assert conn.execute("SELECT to_regclass('ledgerflow.events_p000002')").fetchone() == (None,)


def test_an_append_in_the_callers_transaction_never_waits_for_a_second_connection(database_url: str) -> None:
    """The partition ahead is made by a thread of its own: an appender holding the pool's only connection
    (its own transaction) is not held up waiting for another, and the partition still comes."""
    settings = DatabaseSettings(database_url=database_url, pool_min_size=1, pool_max_size=1)
    with open_store(settings) as store, capture_logs() as logs:
        with store.pool.connection() as conn, conn.transaction():
            store.append("order-1", [NewEvent("Placed", {})], conn=conn)
            assert not [e for e in logs if e["event"] == "log_partition_not_created"]
        wait_until(lambda: store._log_end > 0, what="the partition ahead to be seen")
        assert not [e for e in logs if e["event"] == "log_partition_not_created"]


def test_two_archives_of_one_partition_at_once_archive_it_once(
    small_store: EventStore, tmp_path: Path
) -> None:
    """Operators archiving the same partition at the same moment: one archives it, the other gets a typed
    refusal (or finds it archived), and the log keeps every event once, in the log or in the archive."""
    store = small_store
    _fill(store, 25)
    before = _all(store)
    _cursor_at_end(store, "caught_up")
    barrier = threading.Barrier(2, timeout=60)
    outcomes: list[object] = []

    def archive(k: int) -> None:
        barrier.wait()
        try:
            outcomes.append(archive_partition(store.url, "events_p000001", tmp_path / f"a{k}"))
        except LedgerflowError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=archive, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    archived = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(archived) == 1, outcomes
    assert [type(o) for o in outcomes if isinstance(o, Exception)] == [ArchiveRefusedError], outcomes
    assert _partitions(store)["events_p000001"][2] == "archived"
    assert _all(store) == [e for e in before if e.position >= 11]


def test_appenders_racing_past_narrow_partitions_all_land(small_store: EventStore) -> None:
    """Eight appenders on partitions ten positions wide outrun the partition kept ahead: an append that finds
    no partition for its position has the partitions made and is sent again, and while it does, the others
    take positions (a failed INSERT takes one too). Every append lands, once."""
    _append_from_threads(small_store, 8, 40, lambda n, i: f"w-{n}")
    for n in range(8):
        assert [e.stream_version for e in small_store.read_stream(f"w-{n}")] == list(range(1, 41))

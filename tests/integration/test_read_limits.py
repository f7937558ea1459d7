"""Pages of the log and of streams are bounded by bytes as well as by count, and resuming from where a
page says reads everything else, with no gap and no duplicate."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from eventstore import START, Cursor, EventStore, NewEvent, ReadPage
from tests.waiting import wait_until


def _append_sized(store: EventStore, tenant: str, sizes: list[int]) -> list[uuid.UUID]:
    ids = []
    for i, size in enumerate(sizes):
        event = NewEvent("Sized", {"i": i, "pad": "x" * size})
        store.append(f"s-{i % 3}", [event], tenant=tenant)
        ids.append(event.event_id)
    return ids


def _page(store: EventStore, after: Cursor, **kwargs: Any) -> ReadPage:
    """The next page after `after`, read again while it comes back empty and not caught up: a transaction
    of the server that ended at the horizon while the page was read holds that one read back (the
    horizon is the cluster's, so another test's transaction can)."""
    for _ in range(1000):
        page = store.read_all(after, **kwargs)
        if page.events or page.caught_up:
            return page
    raise AssertionError("1,000 empty pages in a row")


def _read_everything(store: EventStore, tenant: str, limit: int, max_bytes: int) -> list[uuid.UUID]:
    """Page through the tenant's log until every event committed before the start has been passed."""
    target = store.committed_so_far()
    seen: list[uuid.UUID] = []
    cursor = START
    while cursor < target:
        page = store.read_all(cursor, limit=limit, tenant=tenant, max_bytes=max_bytes)
        if page.events:
            # A page cut at its count or byte budget resumes right after its last event; one that read
            # everything below the horizon resumes at the horizon, which is past its last event. Either
            # way the page is not caught up when the transaction at the horizon ended meanwhile (the
            # log's partition keeper, say), so more may be readable at once.
            assert page.cursor >= page.events[-1].cursor > cursor
        else:
            assert page.cursor >= cursor
        seen.extend(e.event_id for e in page.events)
        cursor = page.cursor
    return seen


def test_a_page_stops_once_it_passes_the_byte_budget(store: EventStore) -> None:
    _append_sized(store, "acme", [100_000] * 10)
    target = store.committed_so_far()
    wait_until(
        lambda: len(store.read_all(START, tenant="acme", max_bytes=10**9).events) == 10,
        what="the events to become readable",
    )
    page = _page(store, START, tenant="acme", max_bytes=250_000)
    # 100 kB each: the third passes 250 kB, so the page ends with it.
    assert len(page.events) == 3
    assert not page.caught_up
    assert page.cursor == page.events[-1].cursor < target
    # Read to the end: a page is also not caught up when another transaction of the server ended at the
    # horizon while it was read (then it may be empty), so the rest may take more than one read.
    rest, cursor = [], page.cursor
    for _ in range(1000):
        more = store.read_all(cursor, tenant="acme", max_bytes=10**9)
        rest += more.events
        cursor = more.cursor
        if more.caught_up:
            break
    else:
        raise AssertionError("1,000 reads and still not caught up")
    assert [e.data["i"] for e in rest] == list(range(3, 10))


def test_an_event_larger_than_the_budget_still_makes_progress(store: EventStore) -> None:
    _append_sized(store, "acme", [50_000, 50_000])
    wait_until(lambda: len(store.read_all(START, tenant="acme").events) == 2, what="both events")
    first = _page(store, START, tenant="acme", max_bytes=1)
    assert [e.data["i"] for e in first.events] == [0]
    assert not first.caught_up
    second = _page(store, first.cursor, tenant="acme", max_bytes=1)
    assert [e.data["i"] for e in second.events] == [1]
    assert not second.caught_up
    assert store.read_all(second.cursor, tenant="acme", max_bytes=1).events == ()


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=25),
    limit=st.integers(min_value=1, max_value=30),
    max_bytes=st.integers(min_value=1, max_value=60_000),
)
def test_paging_by_bytes_and_count_reads_every_event_once_in_order(
    store: EventStore, sizes: list[int], limit: int, max_bytes: int
) -> None:
    tenant = f"t{uuid.uuid4().hex[:12]}"
    appended = _append_sized(store, tenant, sizes)
    assert _read_everything(store, tenant, limit, max_bytes) == appended


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=20),
    limit=st.integers(min_value=1, max_value=25),
    max_bytes=st.integers(min_value=1, max_value=60_000),
    backward=st.booleans(),
)
def test_stream_pages_resume_from_next_version_without_gap_or_duplicate(
    store: EventStore, sizes: list[int], limit: int, max_bytes: int, backward: bool
) -> None:
    stream = f"s-{uuid.uuid4().hex[:12]}"
    store.append(stream, [NewEvent("Sized", {"pad": "x" * size}) for size in sizes])
    versions: list[int] = []
    following: int | None = None
    while True:
        page = store.read_stream_page(
            stream, from_version=following, backward=backward, limit=limit, max_bytes=max_bytes
        )
        # A page that stopped at its limit exactly at the end is followed by one empty, final page.
        assert page.events or (page.next_version is None and following is not None)
        versions.extend(e.stream_version for e in page.events)
        if page.next_version is None:
            break
        following = page.next_version
    expected = list(range(1, len(sizes) + 1))
    assert versions == (expected[::-1] if backward else expected)


def test_stream_page_budget_counts_the_json_text(store: EventStore) -> None:
    store.append("big-1", [NewEvent("Sized", {"pad": "x" * 100_000}) for _ in range(5)])
    page = store.read_stream_page("big-1", max_bytes=150_000)
    assert [e.stream_version for e in page.events] == [1, 2]
    assert page.next_version == 3
    assert len(page.events[0].data_json) > 100_000
    assert page.events[0].decode().data["pad"] == "x" * 100_000


def test_a_cursor_from_a_cut_page_is_never_beyond_unread_events(store: EventStore) -> None:
    _append_sized(store, "acme", [30_000] * 6)
    wait_until(lambda: len(store.read_all(START, tenant="acme").events) == 6, what="the events")
    page = _page(store, START, tenant="acme", max_bytes=40_000)
    assert not page.caught_up
    assert page.cursor == page.events[-1].cursor
    assert page.cursor < Cursor(page.events[-1].transaction_id + 1, 0)

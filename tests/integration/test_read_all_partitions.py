"""read_all over a log of many partitions, with writers whose transactions interleave across partition
boundaries: a transaction stamped early writes positions after those of transactions stamped later, so the
resume order (transaction_id, position) moves back and forth between partitions. Every page is exactly
the next events of that order, whatever the cursor, the page's limit or byte budget, or the filter.

Partitions here are 10 positions wide, all made before the writers start.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest

from eventstore import START, Cursor, EventStore, NewEvent, ReadPage, open_store
from tests.narrow_partitions import narrow_partitions
from tests.waiting import wait_until

_SIZE = 10
_WRITERS = 4
_ROUNDS = 5


@pytest.fixture
def small_store(database_url: str) -> Iterator[EventStore]:
    """A store on an empty log of 10-position partitions, made ahead for every event written here."""
    narrow_partitions(database_url, _SIZE, headroom=400)
    with open_store(url=database_url, migrate=False) as store:
        yield store


def _write_interleaved(store: EventStore, rng: random.Random) -> None:
    """Rounds of writers with transactions open at once: each appends a few times, in a random
    interleaving with the others, and commits after its last append."""
    for _ in range(_ROUNDS):
        with ExitStack() as stack:
            conns = [stack.enter_context(psycopg.connect(store.url)) for _ in range(_WRITERS)]
            left = [rng.randint(1, 4) for _ in conns]
            running = list(range(_WRITERS))
            while running:
                w = rng.choice(running)
                events = [NewEvent(rng.choice(("A", "B")), {"w": w}) for _ in range(rng.randint(1, 3))]
                store.append(f"w{w}-{rng.randrange(3)}", events, conn=conns[w])
                left[w] -= 1
                if not left[w]:
                    conns[w].commit()
                    running.remove(w)


def _log(store: EventStore) -> list[tuple[int, int, str, str]]:
    """Every event as (transaction_id, position, type, partition), in resume order."""
    with psycopg.connect(store.url) as conn:
        rows = conn.execute(
            "SELECT transaction_id::text::bigint, position, event_type, tableoid::regclass::text"
            "  FROM ledgerflow.events ORDER BY transaction_id, position"
        ).fetchall()
    return [(int(t), int(p), str(k), str(part)) for t, p, k, part in rows]


def _full_page(store: EventStore, after: Cursor, *, limit: int, **options: Any) -> ReadPage:
    """One page after `after`, read again while it stopped short at the horizon: any transaction on the
    server (another test's database, under xdist) that ends while the page is read holds the horizon for
    that read, and the page says so by not being caught up."""

    def full() -> ReadPage | None:
        page = store.read_all(after, limit=limit, **options)
        return page if page.caught_up or len(page.events) == limit else None

    found = wait_until(full, what="a page not cut short by the horizon")
    assert found is not None
    return found


def _read(store: EventStore, after: Cursor, **options: Any) -> list[int]:
    """The positions of every event after `after`, read page by page until the cursor passes everything
    committed (the horizon may lag for a moment)."""
    target = store.committed_so_far()
    out: list[int] = []
    cursor = after

    def read_on() -> bool:
        nonlocal cursor
        while (page := store.read_all(cursor, **options)).events:
            out.extend(e.position for e in page.events)
            cursor = page.cursor
        cursor = page.cursor
        return not cursor < target

    wait_until(read_on, what="the log to be read to its end")
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pages_follow_the_resume_order_across_interleaved_partitions(
    small_store: EventStore, seed: int
) -> None:
    store = small_store
    _write_interleaved(store, random.Random(seed))
    log = _log(store)
    order = [p for _, p, _, _ in log]
    # The log does move back to an earlier partition in resume order (else this test tests nothing).
    partitions = [part for _, _, _, part in log]
    assert len(set(partitions)) >= 5
    assert any(b < a for a, b in itertools.pairwise(partitions))  # names sort as their ranges

    for limit in (1, 3, 1000):
        assert _read(store, START, limit=limit) == order, f"limit {limit}"
    assert _read(store, START, limit=1000, max_bytes=600) == order
    assert _read(store, START, limit=5, types=["B"]) == [p for _, p, k, _ in log if k == "B"]

    # From every event as the cursor, one page is the events that follow it, in order.
    for i, (tx, position, _, _) in enumerate(log):
        page = _full_page(store, Cursor(tx, position), limit=4)
        assert [e.position for e in page.events] == order[i + 1 : i + 5], f"after event {i}"
        b_page = _full_page(store, Cursor(tx, position), limit=2, types=["B"])
        assert [e.position for e in b_page.events] == [p for _, p, k, _ in log[i + 1 :] if k == "B"][:2]

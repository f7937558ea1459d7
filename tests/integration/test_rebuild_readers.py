"""During a rebuild under continuous appends, a concurrent reader never sees partial tables."""

from __future__ import annotations

import threading

import psycopg

from eventstore import EventStore, NewEvent
from projector import ProjectorWorker, WorkerSettings, rebuild
from tests.projections import make_counter
from tests.waiting import joined


def test_readers_see_complete_tables_throughout_rebuilds(store: EventStore) -> None:
    counter = make_counter()
    for i in range(300):
        store.append(f"s-{i % 7}", [NewEvent("Add", {"amount": 1})])
    worker = ProjectorWorker(store, [counter], WorkerSettings(batch_size=50))
    worker.run_until_caught_up()
    stop = threading.Event()
    problems: list[str] = []
    observations = 0

    def append_and_project() -> None:
        i = 0
        while not stop.is_set():
            store.append(f"s-{i % 7}", [NewEvent("Add", {"amount": 1})])
            worker.work_once()
            i += 1

    def read() -> None:
        nonlocal observations
        seen = 0
        with psycopg.connect(store.url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    row = conn.execute(
                        "SELECT (SELECT count(*) FROM ledgerflow.applied), "
                        "(SELECT sum(n) FROM ledgerflow.counts)"
                    ).fetchone()
                except psycopg.Error as exc:
                    problems.append(f"read failed: {exc}")
                    return
                assert row is not None
                applied, counted = int(row[0]), int(row[1] or 0)
                # Both tables are written in one transaction: a complete copy agrees with itself, and
                # never holds fewer events than a copy seen before (a half-built one would).
                if applied != counted or applied < seen:
                    problems.append(f"partial tables: applied={applied} counted={counted} earlier={seen}")
                seen = max(seen, applied)
                observations += 1

    threads = [threading.Thread(target=append_and_project), threading.Thread(target=read)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            rebuild(store, counter, batch_size=40)
    finally:
        stop.set()
        for t in threads:
            joined(t)
    assert problems == []
    assert observations > 10
    worker.run_until_caught_up()
    with store.pool.connection() as conn:
        assert conn.execute("SELECT max(times) FROM ledgerflow.applied").fetchone() == (1,)
    worker.release_all()

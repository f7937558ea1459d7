"""`through_outages` (eventstore.outage): work that resumes from what it recorded is run again once the
database answers after an outage, the outage reported once; past its patience the outage's error is
raised, and the work is not run again."""

from __future__ import annotations

import socket
import threading

import pytest

from eventstore import DatabaseUnavailableError, EventStore
from eventstore.outage import Outage, through_outages
from eventstore.pooling import Pool


def test_work_the_database_interrupted_runs_again_once_it_answers(store: EventStore) -> None:
    calls: list[int] = []
    told: list[str] = []

    def work() -> int:
        calls.append(len(calls))
        if len(calls) < 3:  # the outage, then a connection the outage left broken
            raise DatabaseUnavailableError("the database connection failed: server closed the connection")
        return 42

    outage = Outage(test="through_outages")
    answer = through_outages(
        work,
        store.pool,
        outage,
        threading.Event(),
        patience=30,
        waiting=lambda exc: told.append(f"waiting: {exc}"),
        resumed=lambda seconds: told.append("resumed"),
    )
    assert answer == 42
    assert len(calls) == 3
    assert told == ["waiting: the database connection failed: server closed the connection", "resumed"]
    state = outage.snapshot()
    assert (state.outages, state.waiting) == (1, False), "one outage, reported once, and over"


def test_past_its_patience_the_outage_is_raised_and_the_work_left(store: EventStore) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    away = Pool(f"postgresql://nobody@127.0.0.1:{port}/none", min_size=0, max_size=1, open=False)
    away.open(wait=False)
    calls: list[int] = []

    def work() -> None:
        calls.append(1)
        raise DatabaseUnavailableError("the database connection failed: Connection refused")

    try:
        with pytest.raises(DatabaseUnavailableError, match="Connection refused"):
            through_outages(work, away, Outage(test="patience"), threading.Event(), patience=0.5)
    finally:
        away.close()
    assert calls == [1], "not run again while the database stayed away"
    # Not a database error: raised at once, as it is.
    with pytest.raises(ZeroDivisionError):
        through_outages(lambda: 1 // 0, store.pool, Outage(test="bug"), threading.Event(), patience=30)

"""Drill: a `ledgerflow worker` process SIGKILLed while its transaction that continues a run as a new one
is open, at its last write (the successor's RunStarted written, the run's RunContinuedAsNew being
written, nothing committed). No successor is left behind; the node is reclaimed by another worker, which
calls `continue_as_new` again: exactly one successor starts per run, and the chain ends."""

from __future__ import annotations

import itertools
import signal
import uuid
from pathlib import Path

import pytest

from eventstore import EventStore
from tests.acceptance.drill_workers import kill, start_worker
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine
from workflows import events as ev
from workflows.testing import wait_for_run

pytestmark = pytest.mark.drill

#: Holds the run's RunContinuedAsNew, the transaction's last write (after the successor's start), open
#: while public.hold_continue has a row, so that the worker can be killed at exactly that moment.
HOLD = """
CREATE TABLE public.hold_continue (x int);
INSERT INTO public.hold_continue VALUES (1);
CREATE FUNCTION public.hold_continue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.hold_continue) THEN
        PERFORM pg_sleep(120);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_continue BEFORE INSERT ON ledgerflow.events FOR EACH ROW
    WHEN (NEW.event_type = 'wf.RunContinuedAsNew')
    EXECUTE FUNCTION public.hold_continue();
"""


def held_backends(store: EventStore) -> list[int]:
    """This database's backends sleeping in the trigger (other databases' are none of this test's)."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'"
        ).fetchall()
    return [r[0] for r in rows]


def successors_started(store: EventStore, run_id: uuid.UUID) -> int:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.events WHERE event_type = 'wf.RunStarted' "
            "AND data ->> 'continued_from' = %s",
            (str(run_id),),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_killed_while_continuing_starts_exactly_one_successor(
    store: EventStore, tmp_path: Path
) -> None:
    with store.pool.connection() as conn:
        conn.execute(HOLD)
    engine = Engine(store, registry)
    first = engine.start("countdown", input={"n": 2}).run_id
    log = tmp_path / "workers.log"
    victim = start_worker(store.url, "victim", log, lease_ttl=1.5)
    try:
        held = wait_until(lambda: held_backends(store) or None, timeout=60, what="the continuing transaction")
    finally:
        kill(victim)
    # The killed client's backend would sleep on: end it, as a server ends a dead client's session.
    with store.pool.connection() as conn:
        for pid in held:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        conn.execute("DELETE FROM public.hold_continue")
    # The successor's start was written in the killed transaction: it went with it.
    assert successors_started(store, first) == 0
    assert engine.load(first).status == "running"
    taker = start_worker(store.url, "taker", log, lease_ttl=1.5)
    try:
        runs = [wait_for_run(engine, first, timeout=60)]
        while runs[-1].continued_as is not None:
            runs.append(wait_for_run(engine, uuid.UUID(runs[-1].continued_as), timeout=60))
    finally:
        taker.send_signal(signal.SIGTERM)
        taker.wait(timeout=30)
    assert [r.status for r in runs] == ["continued", "continued", "succeeded"]
    for before, after in itertools.pairwise(runs):
        assert successors_started(store, before.run_id) == 1
        assert after.continued_from == str(before.run_id)
    first_events = store.read_stream(ev.run_stream(first), limit=10_000)
    assert sum(e.type == ev.RUN_CONTINUED_AS_NEW for e in first_events) == 1
    assert any(e.type == ev.NODE_RECLAIMED for e in first_events), "the killed worker's node was reclaimed"

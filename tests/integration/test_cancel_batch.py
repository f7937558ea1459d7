"""A bulk cancel's batch (`workflows.cancelling.cancel_batch`: one queue statement, one multi-stream
append) does to each run what `Engine.cancel` does to it alone, whatever state the run is in."""

from __future__ import annotations

import pytest

from eventstore import EventStore, WrongExpectedVersionError
from tests import run_twins
from tests.flows import registry
from workflows import Engine, RunStateError
from workflows.cancelling import cancel_batch

STATES = ("running", "claimed", "waiting", "paused", "completed", "cancelled", "being_cancelled")


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def test_a_batch_cancels_each_run_as_a_one_run_cancel_does(store: EventStore, engine: Engine) -> None:
    twins = run_twins.twins(engine, STATES)
    one_by_one = {state: pair[0] for state, pair in twins.items()}
    batched = {state: pair[1] for state, pair in twins.items()}
    before = {r: engine.load(r) for r in [*one_by_one.values(), *batched.values()]}

    alone: dict[str, str | None] = {}
    for state, run_id in one_by_one.items():
        try:
            engine.cancel(run_id, actor="bulk:x")
            alone[state] = None
        except RunStateError as exc:
            alone[state] = str(exc).replace(str(run_id), "RUN")
    with engine.transaction() as conn:
        outcome = cancel_batch(
            store, conn, engine.load_many(list(batched.values())), tenant="default", actor="bulk:x"
        )
    together = {
        state: None if outcome[r] is None else str(outcome[r]).replace(str(r), "RUN")
        for state, r in batched.items()
    }

    assert together == alone
    assert {s for s, why in alone.items() if why is not None} == {"completed", "cancelled"}
    for state in STATES:
        a, b = one_by_one[state], batched[state]
        assert run_twins.effect(store, before[b], engine.load(b)) == run_twins.effect(
            store, before[a], engine.load(a)
        ), state
    assert engine.load(batched["running"]).status == "cancelled"
    assert engine.load(batched["claimed"]).cancel_requested
    assert engine.load(batched["claimed"]).status == "running"  # its node stops at its next call


def test_a_batch_with_a_run_that_changed_since_it_was_read_writes_nothing(
    store: EventStore, engine: Engine
) -> None:
    runs = [engine.start("linear", input=None).run_id for _ in range(3)]
    read = engine.load_many(runs)
    engine.pause(runs[1])  # after the batch read it: its version moved on
    with pytest.raises(WrongExpectedVersionError), engine.transaction() as conn:
        cancel_batch(store, conn, read, tenant="default", actor="bulk:x")
    assert all(engine.load(r).active and not engine.load(r).cancel_requested for r in runs)
    assert engine.load(runs[1]).paused

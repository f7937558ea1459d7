"""A bulk retry's, pause's, resume's or release's page (`workflows.retrying.retry_batch`,
`workflows.pausing`'s `pause_batch` and `resume_batch`, `workflows.releases.release_batch`: one queue
statement, one multi-stream append) does to each run what `Engine.retry`, `pause`, `resume` or
`release_run` does to it alone, whatever state the run is in; a page with a run that changed after it was
read writes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from eventstore import EventStore, WrongExpectedVersionError
from tests import run_twins
from tests.flows import registry
from workflows import Engine, RunStateError, release_run
from workflows import events as ev
from workflows.pausing import pause_batch, resume_batch
from workflows.releases import release_batch
from workflows.retrying import retry_batch
from workflows.run_state import RunState

Batch = Callable[[Engine, psycopg.Connection[Any], Mapping[uuid.UUID, RunState]], dict[uuid.UUID, str | None]]

BATCHES: dict[str, Batch] = {
    "retry": lambda e, c, runs: retry_batch(e.store, e.registry, c, runs, tenant="default", actor="bulk:x"),
    "pause": lambda e, c, runs: pause_batch(e.store, c, runs, tenant="default", actor="bulk:x"),
    "resume": lambda e, c, runs: resume_batch(e.store, c, runs, tenant="default", actor="bulk:x"),
    "release": lambda e, c, runs: release_batch(
        e, c, runs, tenant="default", actor="bulk:x", ended_before=CUTOFF
    ),
}
#: A release action's cutoff that every ended run of the test is within.
CUTOFF = datetime.now(UTC) + timedelta(days=1)

#: The states each kind acts on; the others are skipped (or need nothing), as the one-run action decides.
ACTED_ON = {
    "retry": {"failed", "cancelled", "cancelled_keyed"},
    "pause": {"running", "claimed", "waiting"},
    "resume": {"paused", "paused_claimed"},
    "release": {"completed", "failed", "cancelled", "cancelled_keyed"},
}


@pytest.fixture
def engine(store: EventStore) -> Engine:
    return Engine(store, registry)


def _alone(engine: Engine, kind: str, run_id: uuid.UUID) -> None:
    if kind == "retry":
        engine.retry(run_id, actor="bulk:x")
    elif kind == "pause":
        engine.pause(run_id, actor="bulk:x")
    elif kind == "release":  # as a release action's one-run path asks
        release_run(engine, run_id, actor="bulk:x", ended_before=CUTOFF, idempotency_key=f"k:{run_id}")
    else:
        engine.resume(run_id, actor="bulk:x")


@pytest.mark.parametrize("kind", sorted(BATCHES))
def test_a_batch_acts_on_each_run_as_the_one_run_action_does(
    store: EventStore, engine: Engine, kind: str
) -> None:
    twins = run_twins.twins(engine)
    one_by_one = {state: pair[0] for state, pair in twins.items()}
    batched = {state: pair[1] for state, pair in twins.items()}
    before = {r: engine.load(r) for r in [*one_by_one.values(), *batched.values()]}

    alone: dict[str, str | None] = {}
    for state, run_id in one_by_one.items():
        try:
            _alone(engine, kind, run_id)
            alone[state] = None
        except RunStateError as exc:
            alone[state] = str(exc).replace(str(run_id), "RUN")
    with engine.transaction() as conn:
        outcome = BATCHES[kind](engine, conn, engine.load_many(list(batched.values())))
    together = {
        state: None if outcome[r] is None else str(outcome[r]).replace(str(r), "RUN")
        for state, r in batched.items()
    }

    assert together == alone
    changed = set()
    for state in run_twins.STATES:
        a, b = one_by_one[state], batched[state]
        did = run_twins.effect(store, before[b], engine.load(b))
        assert did == run_twins.effect(store, before[a], engine.load(a)), state
        if did["appended"]:
            changed.add(state)
    assert changed == ACTED_ON[kind]


def test_a_retried_keyed_run_claims_its_key_again_and_a_second_run_of_the_key_in_the_page_is_skipped(
    store: EventStore, engine: Engine
) -> None:
    first = engine.cancel(engine.start("linear", input=None, key="k").run_id).run_id
    second = engine.cancel(engine.start("linear", input=None, key="k").run_id).run_id
    with engine.transaction() as conn:
        outcome = BATCHES["retry"](engine, conn, engine.load_many([first, second]))
    retried = [r for r, why in outcome.items() if why is None]
    assert len(retried) == 1
    skipped = next(why for why in outcome.values() if why is not None)
    assert "key 'k'" in skipped
    # The key is held by the retried run: a start with it returns that run.
    assert engine.start("linear", input=None, key="k").run_id == retried[0]


@pytest.mark.parametrize("kind", sorted(BATCHES))
def test_a_batch_with_a_run_that_changed_since_it_was_read_writes_nothing(
    store: EventStore, engine: Engine, kind: str
) -> None:
    runs = [engine.start("linear", input=None).run_id for _ in range(3)]
    ended = kind in ("retry", "release")
    for run_id in runs:
        if ended:
            engine.cancel(run_id)
        elif kind == "resume":
            engine.pause(run_id)
    read = engine.load_many(runs)
    before = {r: engine.load(r) for r in runs}
    # After the batch read it, its version moves on (its state as it was).
    if ended:
        engine.cancel(engine.retry(runs[1]).run_id)
    else:
        engine.signal(runs[1], "nudge", None)
    with pytest.raises(WrongExpectedVersionError), engine.transaction() as conn:
        BATCHES[kind](engine, conn, read)
    for run_id in runs:
        now = engine.load(run_id)
        assert (now.status, now.paused) == (before[run_id].status, before[run_id].paused)
        assert not any(e.type == "wf.RunReleased" for e in store.read_stream(ev.run_stream(run_id)))
    with store.pool.connection() as conn:
        queued = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_queue WHERE run_id = ANY(%s)", (runs,)
        ).fetchone()
        paused = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_paused_runs WHERE run_id = ANY(%s)", (runs,)
        ).fetchone()
    assert queued is not None
    assert queued[0] == (0 if ended else 3)
    assert paused is not None
    assert paused[0] == (3 if kind == "resume" else 0)

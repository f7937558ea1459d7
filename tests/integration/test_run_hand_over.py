"""The end of a run that claims a node of another run (ledgerflow.wf_record_run_end) hands the worker that
run's state read from its snapshot and the events after it, signals without their payloads: what the
statement returns does not grow with the claimed run's history or with what was sent to it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from eventstore import EventStore
from tests.flows import registry
from workflows import Engine, WorkerSettings, WorkflowWorker, queue_end_rows, queue_node_ends, snapshots
from workflows.queue_claims import Claim
from workflows.run_state import RunState

SETTINGS = WorkerSettings(concurrency=2, lease_ttl=30)
PAD = "p" * 60_000  # under the default cap on a signal's payload (LEDGERFLOW_MAX_SIGNAL_BYTES)


def claimed(engine: Engine, worker: WorkflowWorker, run_id: uuid.UUID) -> tuple[Claim, RunState]:
    (claim,) = worker._claim(1)
    assert claim.run_id == run_id
    return claim, engine.load(run_id, tenant=claim.tenant)


def end_first_run_handing_over(
    engine: Engine, worker: WorkflowWorker, monkeypatch: pytest.MonkeyPatch, prepare: Any
) -> tuple[Claim, queue_end_rows.RunEnded]:
    """Run a `linear` run to its last end, with another run waiting (set up by `prepare(run_id)`); return
    the claim the last end handed over and what its statement returned."""
    wf = registry.get("linear")
    held: Claim | None
    held, run = claimed(engine, worker, engine.start("linear").run_id)
    waiting = engine.start("linear").run_id
    prepare(waiting)
    answers: list[queue_end_rows.RunEnded] = []
    real = queue_node_ends.record_run_end

    def recording(*args: Any, **kwargs: Any) -> queue_end_rows.RunEnded:
        answers.append(real(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(queue_node_ends, "record_run_end", recording)
    for output in ({"n": 1}, {"n": 2}, {"n": 3}):
        assert held is not None
        held = worker.lifecycle.succeeded(held, wf, output, 0.001, claim_next=worker._claimant, run=run)
    assert held is not None
    assert held.run_id == waiting
    (answer,) = answers
    return held, answer


def test_the_hand_over_starts_from_the_claimed_runs_snapshot_and_leaves_signal_payloads_out(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(store, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="hand-over")

    def signalled(run_id: uuid.UUID) -> None:
        for i in range(3):
            engine.signal(run_id, "note", {"i": i, "pad": PAD})
        snapshots.write(store, engine.load(run_id))  # at version 5: start, ready, 3 signals
        for i in range(3, 6):
            engine.signal(run_id, "note", {"i": i, "pad": PAD})

    handed, answer = end_first_run_handing_over(engine, worker, monkeypatch, signalled)
    assert answer.next_run_snapshot is not None
    assert answer.next_run_snapshot[0] == 5
    # After the snapshot: the three later signals and the claim, each signal without its payload.
    versions = [row[5] for row in answer.next_run_events]
    assert versions == [6, 7, 8, 9]
    assert all(PAD not in str(row) for row in answer.next_run_events)
    assert handed.loaded is not None
    assert handed.loaded == engine.load(handed.run_id)
    assert len(handed.loaded.signals) == 6
    assert engine.signal_payload(handed.loaded, 4) == {"i": 4, "pad": PAD}


def test_without_a_snapshot_the_hand_over_reads_the_run_from_its_start(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(store, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="no-snapshot")

    def signalled(run_id: uuid.UUID) -> None:
        engine.signal(run_id, "note", {"pad": PAD})

    handed, answer = end_first_run_handing_over(engine, worker, monkeypatch, signalled)
    assert answer.next_run_snapshot is None
    assert [row[5] for row in answer.next_run_events] == [1, 2, 3, 4]
    assert all(PAD not in str(row) for row in answer.next_run_events)
    assert handed.loaded == engine.load(handed.run_id)


def test_a_snapshot_of_a_format_the_worker_does_not_read_leaves_the_run_to_be_loaded(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(store, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="odd-snapshot")

    def odd_snapshot(run_id: uuid.UUID) -> None:
        with store.pool.connection() as conn:
            conn.execute(
                "INSERT INTO ledgerflow.workflow_run_snapshots (tenant, run_id, version, state)"
                " VALUES ('default', %s, 2, '{\"format\": 0}')",
                (run_id,),
            )

    handed, answer = end_first_run_handing_over(engine, worker, monkeypatch, odd_snapshot)
    assert answer.next_run_snapshot is not None
    assert handed.loaded is None

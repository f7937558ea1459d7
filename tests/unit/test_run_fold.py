"""The typed workflow events and the one fold of a run: events are checked against their models and
written as given; the fold of a run's events gives the worker's state, and the rows of that state, loaded
back at any point and folded on, give the same rows as folding everything at once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore import NewEvent, RecordedEvent
from eventstore.jsonvalue import dumps, loads
from tests.strategies import run_histories
from workflows import event_codec as codec
from workflows import events as ev
from workflows import node_event_models as nem
from workflows.projections import workflow_tables
from workflows.run_fold import apply, fold
from workflows.run_rows import NODE_COLUMNS, RUN_COLUMNS, node_row, run_row, state_from_rows
from workflows.run_state import RunState
from workflows.scheduler import NodeStatus

RUN = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def recorded(events: Sequence[NewEvent], run_id: uuid.UUID = RUN) -> list[RecordedEvent]:
    """The events as the store gives them back: payloads through JSON, versions and times in order."""
    return [
        RecordedEvent(
            position=i + 1,
            transaction_id=1,
            tenant="default",
            stream_id=ev.run_stream(run_id),
            stream_version=i + 1,
            event_id=e.event_id,
            type=e.type,
            data=loads(dumps(dict(e.data))),
            metadata={},
            correlation_id=run_id,
            causation_id=None,
            recorded_at=T0 + timedelta(milliseconds=i),
        )
        for i, e in enumerate(events)
    ]


def started(*nodes: str) -> list[NewEvent]:
    return [
        codec.event(
            ev.RUN_STARTED,
            RUN,
            workflow="wf",
            version="1",
            key=None,
            input={"n": 1},
            input_fingerprint="fp",
            nodes=list(nodes),
            fingerprints=dict.fromkeys(nodes, "f"),
        ),
        codec.event(ev.NODES_READY, RUN, nodes=[nodes[0]]),
    ]


def claimed(node: str, attempt: int = 1, worker: str = "w1") -> NewEvent:
    return codec.event(ev.NODE_CLAIMED, RUN, node=node, attempt=attempt, token=attempt, worker=worker)


# -- the events -----------------------------------------------------------------------------------


def test_an_event_is_written_as_given_with_the_run_id() -> None:
    e = codec.event(
        ev.NODE_SUCCEEDED, RUN, node="a", attempt=2, generation=2, output={"x": [1]}, duration_ms=1.5
    )
    assert e.type == "wf.NodeSucceeded"
    assert dict(e.data) == {
        "run_id": str(RUN),
        "node": "a",
        "attempt": 2,
        "generation": 2,
        "output": {"x": [1]},
        "duration_ms": 1.5,
    }
    assert e.correlation_id == RUN


@pytest.mark.parametrize(
    ("event_type", "fields", "complaint"),
    [
        ("wf.NoSuchThing", {}, "not a workflow event type"),
        (ev.NODE_CLAIMED, {"node": "a", "attempt": 1, "token": 1, "worker": "w", "lease": 5}, "no field"),
        (ev.NODE_CLAIMED, {"node": "a", "attempt": "1", "token": 1, "worker": "w"}, "attempt"),
        (ev.NODE_CLAIMED, {"node": "a", "attempt": 1, "worker": "w"}, "token"),
        (ev.NODES_READY, {"nodes": "a"}, "nodes"),
    ],
)
def test_an_event_that_does_not_fit_its_model_is_refused(
    event_type: str, fields: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ev.WorkflowEventError, match=complaint):
        codec.event(event_type, RUN, **fields)


def test_a_recorded_event_parses_into_its_model() -> None:
    (e,) = recorded([codec.event(ev.NODE_PROGRESS, RUN, node="a", current=3, total=None, message="m")])
    assert codec.parse(e) == nem.NodeProgress(run_id=RUN, node="a", current=3, total=None, message="m")


def test_a_recorded_payload_that_does_not_fit_raises_a_typed_error() -> None:
    (e,) = recorded([codec.event(ev.NODES_READY, RUN, nodes=["a"])])
    broken = RecordedEvent(**{**{f: getattr(e, f) for f in e.__slots__}, "data": {"run_id": str(RUN)}})
    with pytest.raises(ev.WorkflowEventError, match="does not fit"):
        codec.parse(broken)


def test_every_event_type_has_a_model_and_the_tables_read_every_run_event_but_memos() -> None:
    key_events = {ev.KEY_CLAIMED, ev.KEY_RELEASED}
    memos = {ev.STEP_RECORDED, ev.SIGNAL_RECEIVED, ev.SIGNAL_TAKEN}
    # ChildStarted is a memo of its run, read only to link the child's row to its parent.
    assert set(workflow_tables.event_types or []) == set(codec.MODELS) - key_events - memos


# -- the fold -------------------------------------------------------------------------------------


def test_nodes_follow_the_topological_order_of_the_start() -> None:
    run = fold(RUN, "default", recorded(started("c", "a", "b")))
    assert list(run.nodes) == ["c", "a", "b"]
    assert [n.position for n in run.nodes.values()] == [0, 1, 2]
    assert run.statuses == {"c": NodeStatus.READY, "a": NodeStatus.PENDING, "b": NodeStatus.PENDING}


def test_a_reclaimed_node_is_ready_for_anyone_and_counts_a_crash_a_released_one_does_not() -> None:
    events = [
        *started("a"),
        claimed("a"),
        codec.event(
            ev.NODE_RECLAIMED, RUN, node="a", attempt=1, previous_worker="w1", reason="lease_expired"
        ),
        claimed("a", 2, "w2"),
        codec.event(ev.NODE_RELEASED, RUN, node="a", worker="w2"),
    ]
    n = fold(RUN, "default", recorded(events)).node("a")
    assert (n.status, n.crashes, n.worker, n.token, n.attempt) == (NodeStatus.READY, 1, None, None, 2)


def test_a_retried_run_keeps_paid_work_and_restarts_the_crash_count() -> None:
    events = [
        *started("a"),
        claimed("a"),
        codec.event(ev.NODE_CHECKPOINT, RUN, node="a", attempt=1, item="i1", output=7),
        codec.event(ev.STEP_RECORDED, RUN, node="a", attempt=1, key="s", result="paid"),
        codec.event(ev.NODE_PARKED, RUN, node="a", crashes=3, error="crashed 3 times"),
        codec.event(ev.RUN_FAILED, RUN, node="a", error="crashed 3 times"),
        codec.event(ev.RUN_RETRIED, RUN, nodes=["a"], actor="operator"),
    ]
    run = fold(RUN, "default", recorded(events))
    n = run.node("a")
    assert (run.status, run.error, run.finished_at) == ("running", None, None)
    assert (n.status, n.crashes, n.error, n.finished_at) == (NodeStatus.PENDING, 0, None, None)
    assert (n.checkpoints, n.steps, n.checkpoints_taken) == ({"i1": 7}, {"s": "paid"}, 1)


def test_a_refreshed_node_starts_afresh_but_keeps_its_attempt_count_and_place() -> None:
    events = [
        *started("a", "b"),
        claimed("a"),
        codec.event(ev.NODE_CHECKPOINT, RUN, node="a", attempt=1, item="i1", output=7),
        codec.event(ev.NODE_SUCCEEDED, RUN, node="a", attempt=1, generation=1, output=1, duration_ms=2.0),
        codec.event(ev.NODES_READY, RUN, nodes=["b"]),
        claimed("b"),
        codec.event(ev.NODE_SUCCEEDED, RUN, node="b", attempt=1, generation=1, output=2, duration_ms=2.0),
        codec.event(ev.RUN_COMPLETED, RUN),
        codec.event(
            ev.RUN_REFRESHED,
            RUN,
            input=2,
            input_fingerprint="fp2",
            fingerprints={"a": "f", "b": "f"},
            nodes=["b"],
        ),
    ]
    run = fold(RUN, "default", recorded(events))
    b = run.node("b")
    assert (run.status, run.input, run.nodes_done, run.finished_at) == ("running", 2, 1, None)
    assert (b.status, b.attempt, b.position, b.output, b.generation) == (NodeStatus.PENDING, 1, 1, None, None)
    assert run.node("a").checkpoints == {"i1": 7}


def test_memos_change_no_row_and_a_run_end_clears_the_current_node() -> None:
    events = [*started("a"), claimed("a")]
    run = fold(RUN, "default", recorded(events))
    stamped = run.updated_at
    assert (run.current_node, stamped) == ("a", T0 + timedelta(milliseconds=2))
    memo = codec.event(ev.STEP_RECORDED, RUN, node="a", attempt=1, key="s", result=1)
    apply(run, recorded([*events, memo])[-1])
    assert (run.updated_at, run.version) == (stamped, 4)
    apply(run, recorded([*events, memo, codec.event(ev.RUN_CANCELLED, RUN)])[-1])
    assert (run.status, run.current_node, run.finished_at) == (
        "cancelled",
        None,
        T0 + timedelta(milliseconds=4),
    )


def test_events_of_other_types_in_a_run_stream_change_nothing_but_the_version() -> None:
    (e,) = recorded([NewEvent("SomethingElse", {"node": "x"})])
    run = RunState(RUN, "default")
    apply(run, e)
    assert (run.version, run.nodes) == (1, {})


# -- rows: the state's serialisation, loaded back per batch -----------------------------------------


def rows_of(run: RunState) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    return run_row(run), [node_row(run.run_id, n) for n in run.nodes.values()]


def reloaded(run: RunState) -> RunState:
    """The run as the projection loads it back from its rows."""
    row, nodes = rows_of(run)
    return state_from_rows(
        dict(zip(RUN_COLUMNS, row, strict=True)), [dict(zip(NODE_COLUMNS, n, strict=True)) for n in nodes]
    )


@given(history=run_histories(), cuts=st.sets(st.integers(1, 80)))
def test_rows_loaded_back_between_batches_fold_on_to_the_rows_of_the_whole_fold(
    history: tuple[uuid.UUID, list[NewEvent]], cuts: set[int]
) -> None:
    run_id, events = history
    stream = recorded(events, run_id)
    whole = fold(run_id, "default", stream)
    run = RunState(run_id, "default")
    for i, e in enumerate(stream):
        if i in cuts and run.started_at is not None:
            run = reloaded(run)  # a batch boundary: what the projection keeps is the rows
        apply(run, e)
    assert rows_of(run) == rows_of(whole)


@given(history=run_histories())
def test_the_fold_agrees_with_the_events_it_folds(history: tuple[uuid.UUID, list[NewEvent]]) -> None:
    run_id, events = history
    run = fold(run_id, "default", recorded(events, run_id))
    assert run.version == len(events)
    assert run.nodes_done == sum(1 for n in run.nodes.values() if n.status == NodeStatus.SUCCEEDED)
    for n in run.nodes.values():
        assert n.checkpoints_taken == len(n.checkpoints)  # items are checkpointed once each
        if n.status == NodeStatus.RUNNING:
            assert None not in (n.token, n.worker, n.started_at)
        else:
            assert n.token is None
    if run.status in ("succeeded", "failed", "cancelled"):
        assert run.current_node is None
        assert run.finished_at is not None

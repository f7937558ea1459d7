"""The typed event constructors (`workflows.new_events`): one per workflow event type, each giving the same
NewEvent as the untyped `event_codec.event(TYPE, run_id, **fields)` it replaced (the same payload, key for key
and in order, so the stored JSON keeps its shape), and the product writes events only through them."""

from __future__ import annotations

import inspect
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from eventstore import NewEvent
from eventstore.jsonvalue import dumps
from workflows import event_codec as codec
from workflows import event_models as em
from workflows import events as ev
from workflows import new_events as new

RUN = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
OTHER = uuid.UUID("00000000-0000-0000-0000-0000000000bb")
ROOT = Path(__file__).resolve().parents[2]

TRIGGER = em.TriggeringEvent(event_id="e1", stream_id="orders-1", type="Placed", transaction_id=7, position=9)
PARENT = em.ParentLink(run_id=str(OTHER), node="fan_out", parent_close="terminate")
STARTED = {
    "workflow": "etl",
    "version": 2,
    "key": None,
    "input": {"rows": [1, 2]},
    "input_fingerprint": "fp",
    "nodes": ["a", "b"],
    "fingerprints": {"a": "fa", "b": "fb"},
}

#: (constructor, its arguments, the untyped form's type and fields): every shape the engine writes,
#: including each optional field both left out and set.
CASES: list[tuple[Any, dict[str, Any], str, dict[str, Any]]] = [
    (new.run_started, STARTED, ev.RUN_STARTED, STARTED),
    (
        new.run_started,
        {
            **STARTED,
            "key": "k",
            "triggered_by": TRIGGER,
            "priority": 3,
            "tags": {"team": "x"},
            "parent": PARENT,
            "continued_from": OTHER,
        },
        ev.RUN_STARTED,
        {
            **STARTED,
            "key": "k",
            "triggered_by": TRIGGER.model_dump(),
            "priority": 3,
            "tags": {"team": "x"},
            "parent": PARENT.model_dump(),
            "continued_from": str(OTHER),
        },
    ),
    (new.run_started, {**STARTED, "priority": 0, "tags": {}}, ev.RUN_STARTED, STARTED),
    (new.nodes_ready, {"nodes": ["a"]}, ev.NODES_READY, {"nodes": ["a"]}),
    (new.run_cancel_requested, {"actor": None}, ev.RUN_CANCEL_REQUESTED, {"actor": None}),
    (new.run_retried, {"nodes": ["a"], "actor": "op"}, ev.RUN_RETRIED, {"nodes": ["a"], "actor": "op"}),
    (
        new.run_refreshed,
        {"input": 1, "input_fingerprint": "f", "fingerprints": {"a": "x"}, "nodes": ["a"], "actor": None},
        ev.RUN_REFRESHED,
        {"input": 1, "input_fingerprint": "f", "fingerprints": {"a": "x"}, "nodes": ["a"], "actor": None},
    ),
    (new.run_completed, {}, ev.RUN_COMPLETED, {}),
    (new.run_failed, {"node": "a", "error": "boom"}, ev.RUN_FAILED, {"node": "a", "error": "boom"}),
    (new.run_failed, {"node": None, "error": None}, ev.RUN_FAILED, {"node": None, "error": None}),
    (new.run_cancelled, {}, ev.RUN_CANCELLED, {}),
    (
        new.run_continued_as_new,
        {"successor_run_id": OTHER, "node": "a"},
        ev.RUN_CONTINUED_AS_NEW,
        {"successor_run_id": str(OTHER), "node": "a"},
    ),
    (
        new.run_tagged,
        {"tags": {"a": "1", "b": None}, "node": "n"},
        ev.RUN_TAGGED,
        {"tags": {"a": "1", "b": None}, "node": "n"},
    ),
    (
        new.run_tagged,
        {"tags": {"a": "1"}, "node": None, "actor": "op"},
        ev.RUN_TAGGED,
        {"tags": {"a": "1"}, "node": None, "actor": "op"},
    ),
    (
        new.run_paused,
        {"actor": "op", "interrupt_running": False},
        ev.RUN_PAUSED,
        {"actor": "op", "interrupt_running": False},
    ),
    (
        new.run_paused,
        {"actor": None, "interrupt_running": True, "parent_run_id": OTHER},
        ev.RUN_PAUSED,
        {"actor": None, "interrupt_running": True, "parent_run_id": str(OTHER)},
    ),
    (new.run_resumed, {"actor": "op"}, ev.RUN_RESUMED, {"actor": "op"}),
    (
        new.run_resumed,
        {"actor": None, "parent_run_id": OTHER},
        ev.RUN_RESUMED,
        {"actor": None, "parent_run_id": str(OTHER)},
    ),
    (
        new.run_released,
        {"retention_seconds": 86400.0, "actor": "retention:r1"},
        ev.RUN_RELEASED,
        {"retention_seconds": 86400.0, "actor": "retention:r1"},
    ),
    (new.run_restored, {"actor": "op"}, ev.RUN_RESTORED, {"actor": "op"}),
    (new.key_claimed, {}, ev.KEY_CLAIMED, {}),
    (new.key_released, {}, ev.KEY_RELEASED, {}),
    (
        new.node_claimed,
        {"node": "a", "attempt": 1, "token": 5, "worker": "w1"},
        ev.NODE_CLAIMED,
        {"node": "a", "attempt": 1, "token": 5, "worker": "w1"},
    ),
    (
        new.node_progress,
        {"node": "a", "current": 3, "total": None, "message": "m"},
        ev.NODE_PROGRESS,
        {"node": "a", "current": 3, "total": None, "message": "m"},
    ),
    (
        new.node_checkpoint,
        {"node": "a", "attempt": 1, "item": "i1", "output": [1]},
        ev.NODE_CHECKPOINT,
        {"node": "a", "attempt": 1, "item": "i1", "output": [1]},
    ),
    (
        new.step_recorded,
        {"node": "a", "attempt": 1, "key": "s", "result": {"x": 1}},
        ev.STEP_RECORDED,
        {"node": "a", "attempt": 1, "key": "s", "result": {"x": 1}},
    ),
    (
        new.child_started,
        {"node": "a", "key": "c", "child_run_id": OTHER, "workflow": "etl", "parent_close": "abandon"},
        ev.CHILD_STARTED,
        {"node": "a", "key": "c", "child_run_id": str(OTHER), "workflow": "etl", "parent_close": "abandon"},
    ),
    (
        new.node_succeeded,
        {"node": "a", "attempt": 2, "generation": 2, "output": None, "duration_ms": 1.5},
        ev.NODE_SUCCEEDED,
        {"node": "a", "attempt": 2, "generation": 2, "output": None, "duration_ms": 1.5},
    ),
    (
        new.node_retry_scheduled,
        {"node": "a", "attempt": 1, "error": "e", "retry_in": 0.5},
        ev.NODE_RETRY_SCHEDULED,
        {"node": "a", "attempt": 1, "error": "e", "retry_in": 0.5},
    ),
    (
        new.node_failed,
        {"node": "a", "attempt": 1, "error": "e", "error_class": "ValueError"},
        ev.NODE_FAILED,
        {"node": "a", "attempt": 1, "error": "e", "error_class": "ValueError"},
    ),
    (
        new.node_reclaimed,
        {"node": "a", "attempt": 1, "previous_worker": "w1", "reason": "stuck"},
        ev.NODE_RECLAIMED,
        {"node": "a", "attempt": 1, "previous_worker": "w1", "reason": "stuck"},
    ),
    (new.node_released, {"node": "a", "worker": "w1"}, ev.NODE_RELEASED, {"node": "a", "worker": "w1"}),
    (
        new.node_released,
        {"node": "a", "worker": None, "reason": "paused"},
        ev.NODE_RELEASED,
        {"node": "a", "worker": None, "reason": "paused"},
    ),
    (
        new.node_stuck,
        {"node": "a", "seconds": 12.5, "action": "retry"},
        ev.NODE_STUCK,
        {"node": "a", "seconds": 12.5, "action": "retry"},
    ),
    (
        new.node_parked,
        {"node": "a", "crashes": 3, "error": "crashed"},
        ev.NODE_PARKED,
        {"node": "a", "crashes": 3, "error": "crashed"},
    ),
    (new.node_cancelled, {"node": "a"}, ev.NODE_CANCELLED, {"node": "a"}),
    (
        new.node_waiting,
        {"node": "a", "attempt": 1, "key": "w", "until": None, "signal": "go"},
        ev.NODE_WAITING,
        {"node": "a", "attempt": 1, "key": "w", "until": None, "signal": "go"},
    ),
    (
        new.signal_received,
        {"name": "go", "payload": {"p": 1}, "actor": None},
        ev.SIGNAL_RECEIVED,
        {"name": "go", "payload": {"p": 1}, "actor": None},
    ),
    (
        new.signal_taken,
        {"node": "a", "attempt": 1, "key": "w", "name": "go", "index": None},
        ev.SIGNAL_TAKEN,
        {"node": "a", "attempt": 1, "key": "w", "name": "go", "index": None},
    ),
]


def _same(made: NewEvent, old: NewEvent) -> None:
    """The same event but for its fresh event id, and the same JSON payload text, key order included."""
    assert (made.type, made.metadata, made.correlation_id, made.causation_id) == (
        old.type,
        old.metadata,
        old.correlation_id,
        old.causation_id,
    )
    assert list(made.data.items()) == list(old.data.items())
    assert dumps(dict(made.data)) == dumps(dict(old.data))


@pytest.mark.parametrize(("make", "args", "event_type", "fields"), CASES)
def test_each_constructor_gives_the_untyped_form(
    make: Any, args: dict[str, Any], event_type: str, fields: dict[str, Any]
) -> None:
    _same(make(run_id=RUN, **args), codec.event(event_type, RUN, **fields))


def _constructors() -> dict[str, Any]:
    return {
        name: f
        for name, f in vars(new).items()
        if inspect.isfunction(f) and f.__module__ == new.__name__ and not name.startswith("_")
    }


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_every_event_type_has_one_constructor_taking_its_models_fields_by_keyword() -> None:
    constructors = _constructors()
    assert set(constructors) == {_snake(m.__name__) for m in codec.MODELS.values()}
    assert {make for make, *_ in CASES} == set(constructors.values()), "a constructor without a case"
    for model in codec.MODELS.values():
        params = inspect.signature(constructors[_snake(model.__name__)]).parameters
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values()), model.__name__
        assert set(params) == set(model.model_fields), model.__name__


def test_a_bad_field_is_still_refused_at_run_time() -> None:
    with pytest.raises(ev.WorkflowEventError):
        new.node_claimed(run_id=RUN, node="a", attempt="1", token=1, worker="w")  # type: ignore[arg-type]


def test_the_product_writes_workflow_events_only_through_the_constructors() -> None:
    untyped = re.compile(r"\b(ev|events)\.event\(")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in ("eventstore", "projector", "workflows", "ops")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name not in {"events.py", "new_events.py"} or path.parent.name != "workflows"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if untyped.search(line)
    ]
    assert found == [], f"untyped workflow event writes (use workflows.new_events): {found}"

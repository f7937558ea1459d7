"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from eventstore import NewEvent
from workflows import event_codec as codec
from workflows import events as ev

# Text PostgreSQL can store: no NUL, no lone surrogates (the store refuses those with a typed error).
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | storable_text
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
)

json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4),
    max_leaves=12,
)

json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(storable_text, json_values, max_size=5)

event_types = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_.:-]{0,20}\Z")


def as_json_numbers(value: Any) -> Any:
    """`value` with every number as a Decimal. PostgreSQL's jsonb keeps numbers as exact decimals and
    JSON has no int/float distinction: 7.205759403792151e16 may come back as the int 72057594037921510,
    the same number. Comparing through Decimal checks that the value, not its Python type, survived."""
    from decimal import Decimal

    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [as_json_numbers(v) for v in value]
    return {k: as_json_numbers(v) for k, v in value.items()}


# -- workflow runs ---------------------------------------------------------------------------------


@dataclass
class _RunModel:
    """Just enough of the engine's rules to produce event sequences it could write for one run: a DAG of
    nodes, each node's status, attempts and crashes, the run's status and its cancel flag."""

    run_id: uuid.UUID
    deps: dict[str, set[str]]
    events: list[NewEvent] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    run_status: str = "running"
    cancel_requested: bool = False
    paused: bool = False
    tokens: int = 0
    names: int = 0  # for fresh checkpoint items, step keys, child keys

    def emit(self, event_type: str, **data: Any) -> None:
        self.events.append(codec.event(event_type, self.run_id, **data))

    def fresh(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def with_status(self, *statuses: str) -> list[str]:
        return [n for n, s in self.status.items() if s in statuses]

    def make_ready(self) -> None:
        """Pending nodes whose dependencies all succeeded become ready (none once cancelling)."""
        if self.cancel_requested:
            return
        ready = [
            n
            for n, s in self.status.items()
            if s == "pending" and all(self.status[d] == "succeeded" for d in self.deps[n])
        ]
        for n in ready:
            self.status[n] = "ready"
        if ready:
            self.emit(ev.NODES_READY, nodes=ready)

    def maybe_end(self, error: str | None = None) -> None:
        in_flight = self.with_status("running", "ready", "retry_scheduled", "waiting")
        if self.cancel_requested:
            if not self.with_status("running"):
                self.emit(ev.RUN_CANCELLED)
                self.run_status = "cancelled"
        elif all(s == "succeeded" for s in self.status.values()):
            self.emit(ev.RUN_COMPLETED)
            self.run_status = "succeeded"
        elif self.with_status("failed", "parked") and not in_flight:
            culprit = self.with_status("failed", "parked")[0]
            self.emit(ev.RUN_FAILED, node=culprit, error=error or f"{culprit} failed")
            self.run_status = "failed"

    def descendants(self, names: set[str]) -> set[str]:
        found = set(names)
        while True:
            more = {n for n, ds in self.deps.items() if ds & found} - found
            if not more:
                return found
            found |= more


_any_uuid = st.uuids()
_messages = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=12)


@st.composite
def run_histories(
    draw: st.DrawFn, max_steps: int = 25, run_ids: st.SearchStrategy[uuid.UUID] = _any_uuid
) -> tuple[uuid.UUID, list[NewEvent]]:
    """A run's stream as the engine could write it: started, nodes made ready, claimed with fencing
    tokens, progressing, checkpointing, memoizing steps, succeeding, retrying, failing, reclaimed after a
    crash or when stuck, released, parked, cancelled, and the run retried or refreshed by an operator.
    Tests that keep the runs of many examples in one database draw fresh `run_ids`
    (`st.builds(uuid.uuid4)`), so that no two histories share a stream."""
    run_id = draw(run_ids)
    tags = draw(st.dictionaries(_tag_keys, _tag_values, max_size=3))
    size = draw(st.integers(1, 4))
    nodes = [f"n{i}" for i in range(size)]
    deps = {n: draw(st.sets(st.sampled_from(nodes[:i]))) if i else set() for i, n in enumerate(nodes)}
    run = _RunModel(run_id, deps, status=dict.fromkeys(nodes, "pending"), attempts=dict.fromkeys(nodes, 0))
    run.crashes = dict.fromkeys(nodes, 0)
    run.emit(
        ev.RUN_STARTED,
        workflow="wf",
        version="1",
        key=draw(st.none() | st.sampled_from(["k1", "k2"])),
        input=draw(json_values),
        input_fingerprint="fp",
        nodes=nodes,
        fingerprints=dict.fromkeys(nodes, "f1"),
        **({"tags": tags} if tags else {}),
    )
    run.make_ready()
    for _ in range(draw(st.integers(0, max_steps))):
        moves = _moves(run)
        if not moves:
            break
        draw(st.sampled_from(moves))(draw, run)
    return run_id, run.events


Move = Callable[[st.DrawFn, _RunModel], None]


def _moves(run: _RunModel) -> list[Move]:
    if run.run_status in ("failed", "cancelled"):
        return [_retry_run]
    if run.run_status == "succeeded":
        return [_refresh_run]
    moves: list[Move] = []
    if not run.cancel_requested:
        moves.append(_cancel_run)
        # A paused run starts no node until it is resumed.
        moves.append(_resume_run if run.paused else _pause_run)
        if not run.paused:
            moves += [_claim(n) for n in run.with_status("ready", "retry_scheduled", "waiting")]
    moves += [_signal, _tag]
    for n in run.with_status("running"):
        if run.cancel_requested:
            moves.append(_cancelled_at_next_write(n))
        moves += [_work(n, kind) for kind in ("progress", "checkpoint", "step", "child", "take")]
        moves.append(_wait(n))
        moves += [_succeed(n), _retry_later(n), _fail(n), _crash(n), _stuck(n), _park(n), _release(n)]
    return moves


def _claim(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        run.attempts[node] += 1
        run.tokens += 1
        run.status[node] = "running"
        worker = draw(st.sampled_from(["w1", "w2"]))
        run.emit(ev.NODE_CLAIMED, node=node, attempt=run.attempts[node], token=run.tokens, worker=worker)

    return move


def _work(node: str, kind: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        attempt = run.attempts[node]
        if kind == "progress":
            total = draw(st.none() | st.integers(0, 1000))
            run.emit(
                ev.NODE_PROGRESS,
                node=node,
                current=draw(st.integers(0, 1000)),
                total=total,
                message=draw(_messages),
            )
        elif kind == "checkpoint":
            item, output = run.fresh("item"), draw(json_values)
            run.emit(ev.NODE_CHECKPOINT, node=node, attempt=attempt, item=item, output=output)
        elif kind == "step":
            key, result = run.fresh("step"), draw(json_values)
            run.emit(ev.STEP_RECORDED, node=node, attempt=attempt, key=key, result=result)
        elif kind == "take":
            index = draw(st.none() | st.integers(0, 5))
            run.emit(
                ev.SIGNAL_TAKEN, node=node, attempt=attempt, key=run.fresh("wait"), name="go", index=index
            )
        else:
            child = str(draw(st.uuids()))
            run.emit(
                ev.CHILD_STARTED, node=node, key=run.fresh("child"), child_run_id=child, workflow="child"
            )

    return move


def _wait(node: str) -> Move:
    """The node suspends itself: a timer (a due time) or a signal wait (with or without a timeout)."""

    def move(draw: st.DrawFn, run: _RunModel) -> None:
        due = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC))
        until = draw(st.none() | due.map(datetime.isoformat))
        signal = draw(st.none() | st.sampled_from(["go", "approve"])) if until is not None else "go"
        key = run.fresh("wait")
        run.emit(ev.NODE_WAITING, node=node, attempt=run.attempts[node], key=key, until=until, signal=signal)
        run.status[node] = "waiting"

    return move


def _signal(draw: st.DrawFn, run: _RunModel) -> None:
    run.emit(ev.SIGNAL_RECEIVED, name=draw(st.sampled_from(["go", "approve"])), payload=draw(json_values))


_tag_keys = st.sampled_from(["team", "env", "customer", "a.b:c/d-e"])
_tag_values = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc", "Z"]), max_size=8)


def _tag(draw: st.DrawFn, run: _RunModel) -> None:
    """Tags set (or, with None, removed) by a node of the run or an operator."""
    change = draw(st.dictionaries(_tag_keys, st.none() | _tag_values, min_size=1, max_size=3))
    run.emit(ev.RUN_TAGGED, tags=change, node=draw(st.none() | st.sampled_from(list(run.status))))


def _succeed(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        attempt = run.attempts[node]
        duration = draw(st.floats(0, 1e6, allow_nan=False))
        output = draw(json_values)
        run.emit(
            ev.NODE_SUCCEEDED,
            node=node,
            attempt=attempt,
            generation=attempt,
            output=output,
            duration_ms=duration,
        )
        run.status[node] = "succeeded"
        run.make_ready()
        run.maybe_end()

    return move


def _retry_later(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        error = draw(_messages)
        run.emit(ev.NODE_RETRY_SCHEDULED, node=node, attempt=run.attempts[node], error=error, retry_in=0.5)
        run.status[node] = "retry_scheduled"

    return move


def _fail(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        error = draw(_messages)
        run.emit(ev.NODE_FAILED, node=node, attempt=run.attempts[node], error=error, error_class="ValueError")
        run.status[node] = "failed"
        run.maybe_end(error)

    return move


def _crash(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        run.emit(
            ev.NODE_RECLAIMED, node=node, attempt=run.attempts[node], previous_worker="w1", reason="gone"
        )
        run.status[node] = "ready"
        run.crashes[node] += 1

    return move


def _stuck(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        run.emit(ev.NODE_STUCK, node=node, seconds=draw(st.floats(0, 1e5)), action="retry")
        _crash(node)(draw, run)

    return move


def _park(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        run.crashes[node] += 1
        crashes = run.crashes[node]
        run.emit(ev.NODE_PARKED, node=node, crashes=crashes, error=f"crashed {crashes} times")
        run.status[node] = "parked"
        run.maybe_end()

    return move


def _release(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        run.emit(ev.NODE_RELEASED, node=node, worker="w1")
        run.status[node] = "ready"

    return move


def _cancelled_at_next_write(node: str) -> Move:
    def move(draw: st.DrawFn, run: _RunModel) -> None:
        run.emit(ev.NODE_CANCELLED, node=node)
        run.status[node] = "cancelled"
        run.maybe_end()

    return move


def _pause_run(draw: st.DrawFn, run: _RunModel) -> None:
    run.paused = True
    run.emit(ev.RUN_PAUSED, actor="operator", interrupt_running=draw(st.booleans()))


def _resume_run(draw: st.DrawFn, run: _RunModel) -> None:
    run.paused = False
    run.emit(ev.RUN_RESUMED, actor="operator")


def _cancel_run(draw: st.DrawFn, run: _RunModel) -> None:
    run.paused = False  # a cancellation ends the pause
    run.cancel_requested = True
    run.emit(ev.RUN_CANCEL_REQUESTED, actor="operator")
    for n in run.with_status("pending", "ready", "retry_scheduled", "waiting"):
        run.emit(ev.NODE_CANCELLED, node=n)
        run.status[n] = "cancelled"
    run.maybe_end()


def _retry_run(draw: st.DrawFn, run: _RunModel) -> None:
    """An operator's retry: failed, parked and cancelled nodes (and what waits behind them) run again."""
    reset = run.descendants(set(run.with_status("failed", "parked", "cancelled"))) - set(
        run.with_status("succeeded")
    )
    run.run_status, run.cancel_requested, run.paused = "running", False, False
    run.emit(ev.RUN_RETRIED, nodes=sorted(reset), actor="operator")
    for n in reset:
        run.status[n], run.crashes[n] = "pending", 0
    run.make_ready()


def _refresh_run(draw: st.DrawFn, run: _RunModel) -> None:
    """An operator's refresh with new input: the changed nodes and their descendants run again."""
    changed = draw(st.sets(st.sampled_from(sorted(run.status)), min_size=1))
    rerun = run.descendants(changed)
    run.run_status, run.paused = "running", False
    fingerprints = {n: draw(st.sampled_from(["f1", "f2"])) for n in run.status}
    run.emit(
        ev.RUN_REFRESHED,
        input=draw(json_values),
        input_fingerprint=run.fresh("fp"),
        fingerprints=fingerprints,
        nodes=sorted(rerun),
        actor="operator",
    )
    for n in rerun:
        run.status[n], run.crashes[n] = "pending", 0
    run.make_ready()


#: Histories of personal data: appends of a subject's personal value (and a plain one), forgettings, and
#: retries of an earlier append under its idempotency key (by index, modulo the appends so far).
shredding_subjects = st.sampled_from(["ann", "bob", "cyd"])
shredding_moves = st.lists(
    st.one_of(
        st.tuples(st.just("append"), shredding_subjects, storable_text, st.integers(0, 99)),
        st.tuples(st.just("forget"), shredding_subjects),
        st.tuples(st.just("retry"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=15,
)


@st.composite
def bulk_fleets(
    draw: st.DrawFn,
) -> tuple[list[tuple[str, str, bool]], tuple[str | None, str | None, bool], str]:
    """Runs for a bulk action, its filter and its kind: each run a (team, env, cancelled first) triple; the
    filter a team, an env (either may be absent) and whether it keeps only running runs; the kind one that
    acts on a running run (cancel or pause)."""
    teams, envs = st.sampled_from(["red", "blue"]), st.sampled_from(["dev", "prod", "test"])
    runs = draw(st.lists(st.tuples(teams, envs, st.booleans()), min_size=0, max_size=8))
    wanted = (draw(st.none() | teams), draw(st.none() | envs), draw(st.booleans()))
    return runs, wanted, draw(st.sampled_from(["cancel", "pause"]))

"""A node's end on the hot path: what it costs on the wire, what the worker keeps in memory, and that two
siblings ending at the same moment start their common dependent exactly once."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore import DatabaseSettings, EventStore, WrongExpectedVersionError, open_store
from tests.flows import registry
from tests.waiting import joined
from workflows import Engine, WorkerSettings, WorkflowWorker, queue_node_ends
from workflows import event_codec as codec
from workflows import events as ev
from workflows import node_event_models as nem
from workflows.errors import wrap_exceptions
from workflows.node_end_writes import claimed_event
from workflows.queue_claims import Claim
from workflows.queue_node_ends import Successor
from workflows.run_state import RunState

SETTINGS = WorkerSettings(concurrency=2, lease_ttl=30)


@pytest.fixture
def one_connection(database_url: str) -> Iterator[EventStore]:
    """A store whose pool holds a single connection, so that every statement of the engine goes over it."""
    settings = DatabaseSettings(pool_min_size=1, pool_max_size=1)
    with open_store(settings, url=database_url, migrate=False) as opened:
        yield opened


@dataclass(frozen=True)
class Wire:
    """What went over the connection, from libpq's protocol trace."""

    statements: list[str]
    round_trips: int
    commits: int


@dataclass
class Tracer:
    store: EventStore
    path: Path

    def __enter__(self) -> Tracer:
        self._file = self.path.open("w")
        with self.store.pool.connection() as conn:
            conn.pgconn.trace(self._file.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        return self

    def __exit__(self, *exc: object) -> None:
        with self.store.pool.connection() as conn:
            conn.pgconn.untrace()
        self._file.close()

    def wire(self) -> Wire:
        # One message per entry: "F|B <tab> length <tab> type <tab> fields", fields possibly spanning lines.
        messages = re.findall(
            r"^([FB])\t\d+\t(\w+)\t?(.*?)(?=^[FB]\t\d+\t|\Z)", self.path.read_text(), re.M | re.S
        )
        statements: list[str] = []
        round_trips = commits = 0
        previous = ""
        for direction, message, fields in messages:
            if direction == "F" and message == "Parse":
                statements.append(fields.split('"')[3])
            if direction == "B" and previous == "F":
                round_trips += 1  # the client sent, then had to wait for the server's answer
            if direction == "B" and message == "CommandComplete" and '"COMMIT"' in fields:
                commits += 1
            previous = direction
        return Wire(statements, round_trips, commits)


def claimed(engine: Engine, worker: WorkflowWorker, run_id: uuid.UUID) -> tuple[Claim, RunState]:
    (claim,) = worker._claim(1)
    assert claim.run_id == run_id
    return claim, engine.load(run_id, tenant=claim.tenant)


def test_a_node_success_and_the_end_of_a_run_with_the_next_claim_are_one_statement_each(
    one_connection: EventStore, tmp_path: Path
) -> None:
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="counted")
    wf = registry.get("linear")
    run_id = engine.start("linear", input={"n": 2}).run_id
    claim, run = claimed(engine, worker, run_id)

    # The first end also draws the worker's first block of fencing tokens; count the second and third.
    successor = worker.lifecycle.succeeded(claim, wf, {"n": 2}, 0.001, claim_next=worker._claimant, run=run)
    assert successor is not None
    assert successor.node == "second"
    for node, output, follows in (("second", {"n": 4}, "third"), ("third", {"n": 5}, None)):
        tracer = Tracer(one_connection, tmp_path / f"{node}.trace")
        with tracer:
            assert successor is not None
            assert successor.node == node
            successor = worker.lifecycle.succeeded(
                successor, wf, output, 0.001, claim_next=worker._claimant, run=run
            )
        wire = tracer.wire()
        assert not any("FROM ledgerflow.events" in s for s in wire.statements), wire
        if node == "second":
            # The queue's change (fence, row, successor claimed) and the events that record it: one
            # statement in autocommit, so one transaction and one round trip, and no read of the stream.
            assert len(wire.statements) == 1, wire
            assert "ledgerflow.wf_record_node_end(" in wire.statements[0]
            assert wire.round_trips == 1, wire
        else:
            # The run's last end (a run without a key): the queue's change, the run's events and the claim
            # of another run's ready node (there is none here), in one statement: one round trip, one
            # transaction.
            assert len(wire.statements) == 1, wire
            assert "ledgerflow.wf_record_run_end(" in wire.statements[0]
            assert wire.round_trips == 1, wire
        assert (successor.node if successor else None) == follows

    # What the worker kept in memory is what the log folds to.
    assert run == engine.load(run_id)
    assert run.status == "succeeded"


def test_a_claim_is_one_statement_that_records_what_claimed_event_builds(
    one_connection: EventStore, tmp_path: Path
) -> None:
    """The claim appends its NodeClaimed itself (ledgerflow.wf_record_claims): one statement, one round
    trip, and the event is the one the worker builds for the claims it makes in Python (hand-offs,
    recovery)."""
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="claimer")
    run_id = engine.start("linear", input={"n": 2}).run_id
    tracer = Tracer(one_connection, tmp_path / "claim.trace")
    with tracer:
        (claim,) = worker._claim(1)
    wire = tracer.wire()
    assert len(wire.statements) == 1, wire
    assert wire.round_trips == 1, wire
    recorded = engine.store.read_stream(ev.run_stream(run_id))[-1]
    built = claimed_event(claim, worker.id)
    assert (recorded.type, recorded.data, recorded.metadata, recorded.correlation_id) == (
        built.type,
        built.data,
        built.metadata,
        built.correlation_id,
    )
    assert isinstance(codec.parse(recorded), nem.NodeClaimed)  # it fits its model
    assert engine.load(run_id).node("first").token == claim.token


def test_the_end_of_a_run_hands_the_worker_a_node_of_another_run(
    one_connection: EventStore, tmp_path: Path
) -> None:
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="next-run")
    wf = registry.get("linear")
    first_run = engine.start("linear").run_id
    claim, run = claimed(engine, worker, first_run)
    waiting = engine.start("linear").run_id
    held: Claim | None = claim
    for output in ({"n": 1}, {"n": 2}):
        assert held is not None
        held = worker.lifecycle.succeeded(held, wf, output, 0.001, claim_next=worker._claimant, run=run)
    tracer = Tracer(one_connection, tmp_path / "last.trace")
    with tracer:
        assert held is not None
        handed = worker.lifecycle.succeeded(held, wf, {"n": 3}, 0.001, claim_next=worker._claimant, run=run)
    wire = tracer.wire()
    # The last node's end and the claim of the waiting run's first node, whose NodeClaimed the claim
    # appends itself: one statement, one round trip, instead of a transaction of its own.
    assert len(wire.statements) == 1, wire
    assert wire.round_trips == 1, wire
    assert run.status == "succeeded"
    assert handed is not None
    assert (handed.run_id, handed.node, handed.attempt) == (waiting, "first", 1)
    other = engine.load(waiting)
    assert other.node("first").status == "running"
    assert other.node("first").token == handed.token
    (recorded,) = [e for e in one_connection.read_stream(ev.run_stream(waiting)) if e.type == ev.NODE_CLAIMED]
    assert recorded.data == claimed_event(handed, worker.id).data
    # The same statement read the waiting run: the worker starts its node with what the log folds to.
    assert handed.loaded == other
    assert worker._claim(1) == []  # it was the only ready node


def test_a_run_longer_than_the_end_of_a_run_reads_is_read_when_its_node_starts(
    one_connection: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a run reads a page of the next run; a longer run is handed over without its state, which
    the worker then reads whole."""
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="long-next")
    wf = registry.get("linear")
    handed: list[Claim] = []
    for page in (3, 4):  # RunStarted, NodesReady, NodeClaimed: more than a page of 3, less than 4
        monkeypatch.setattr(worker.lifecycle, "_hand_over_reads", page)
        held, run = claimed(engine, worker, engine.start("linear").run_id)
        waiting = engine.start("linear").run_id
        for output in ({"n": 1}, {"n": 2}, {"n": 3}):
            assert held is not None
            held = worker.lifecycle.succeeded(held, wf, output, 0.001, claim_next=worker._claimant, run=run)
        assert held is not None
        assert held.run_id == waiting
        handed.append(held)
    assert handed[0].loaded is None
    assert handed[1].loaded == engine.load(handed[1].run_id)


def test_the_worker_keeps_the_run_it_holds_in_memory(one_connection: EventStore) -> None:
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="memory")
    wf = registry.get("drill")
    run_id = engine.start("drill", input={"items": 2}).run_id
    claim, run = claimed(engine, worker, run_id)
    successor = worker.lifecycle.succeeded(claim, wf, [0, 1], 0.001, claim_next=worker._claimant, run=run)
    assert successor is not None
    # Fan-out: one successor is handed over, the other queued as ready; the copy knows both.
    assert run == engine.load(run_id)
    assert run.node(successor.node).token == successor.token
    # A version it does not know (another worker's claim of the sibling) is read on the next end.
    (sibling,) = WorkflowWorker(engine, registry, SETTINGS, name="other")._claim(1)
    assert run.version < engine.load(run_id).version
    worker.lifecycle.succeeded(successor, wf, 1, 0.001, run=run)
    assert run == engine.load(run_id)
    assert run.node(sibling.node).status == "running"


def test_a_node_end_at_a_version_that_no_longer_holds_changes_nothing(one_connection: EventStore) -> None:
    """The one-statement end fails whole on the log's version check: the queue's change (the node's row
    gone, its successor queued and claimed) goes with the events."""
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="stale")
    wf = registry.get("linear")
    run_id = engine.start("linear", input={"n": 2}).run_id
    claim, run = claimed(engine, worker, run_id)
    succeeded = codec.event(
        ev.NODE_SUCCEEDED,
        run_id,
        node="first",
        attempt=claim.attempt,
        generation=claim.attempt,
        output={"n": 2},
        duration_ms=1.0,
    )
    queue_rows = "SELECT node, status, token FROM ledgerflow.workflow_queue WHERE run_id = %s ORDER BY node"
    with one_connection.pool.connection() as conn:
        before = conn.execute(queue_rows, [run_id]).fetchall()
        append = one_connection.one_stream_params(
            ev.run_stream(run_id), [succeeded], run.version - 1, claim.tenant
        )
        successor = Successor(worker._claimant, worker._claimant.tokens.take(conn))
        with pytest.raises(WrongExpectedVersionError), wrap_exceptions():
            queue_node_ends.record_node_end(
                conn, claim, append, ready=[wf.nodes["second"]], successor=successor
            )
        assert conn.execute(queue_rows, [run_id]).fetchall() == before == [("first", "claimed", claim.token)]
    assert engine.load(run_id) == run


def test_the_end_of_a_run_with_a_key_releases_it_and_still_hands_over_a_node_of_another_run(
    one_connection: EventStore, tmp_path: Path
) -> None:
    """A run with a key ends in the pipelined transaction (its key is released in a stream of its own),
    which claims the next run's node too."""
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="keyed")
    wf = registry.get("linear")
    keyed = engine.start("linear", key="report-7").run_id
    held, run = claimed(engine, worker, keyed)
    waiting = engine.start("linear").run_id
    for output in ({"n": 1}, {"n": 2}):
        held = worker.lifecycle.succeeded(held, wf, output, 0.001, claim_next=worker._claimant, run=run)
        assert held is not None
    tracer = Tracer(one_connection, tmp_path / "keyed.trace")
    with tracer:
        handed = worker.lifecycle.succeeded(held, wf, {"n": 3}, 0.001, claim_next=worker._claimant, run=run)
    wire = tracer.wire()
    assert (wire.statements[0], wire.statements[-1], wire.commits) == ("BEGIN", "COMMIT", 1), wire
    assert run.status == "succeeded"
    assert handed is not None
    assert (handed.run_id, handed.node) == (waiting, "first")
    # The key is free again: a new run may take it.
    assert engine.start("linear", key="report-7").run_id != keyed


def test_the_end_of_a_run_at_a_version_that_no_longer_holds_claims_nothing(
    one_connection: EventStore,
) -> None:
    """The one-statement end of a run fails whole on the log's version check: the claim of another run's
    node, and its NodeClaimed, go with the end."""
    engine = Engine(one_connection, registry)
    worker = WorkflowWorker(engine, registry, SETTINGS, name="stale-end")
    run_id = engine.start("linear", input={"n": 2}).run_id
    claim, run = claimed(engine, worker, run_id)
    waiting = engine.start("linear").run_id
    completed = [
        codec.event(
            ev.NODE_SUCCEEDED,
            run_id,
            node="first",
            attempt=claim.attempt,
            generation=claim.attempt,
            output=1,
            duration_ms=1.0,
        ),
        codec.event(ev.RUN_COMPLETED, run_id),
    ]
    queue_rows = "SELECT run_id, node, status, token FROM ledgerflow.workflow_queue ORDER BY run_id, node"
    with one_connection.pool.connection() as conn:
        before = conn.execute(queue_rows).fetchall()
        append = one_connection.one_stream_params(
            ev.run_stream(run_id), completed, run.version - 1, claim.tenant
        )
        with pytest.raises(WrongExpectedVersionError), wrap_exceptions():
            queue_node_ends.record_run_end(conn, claim, append, worker._claimant, read_limit=10)
        assert conn.execute(queue_rows).fetchall() == before
    assert engine.load(run_id) == run
    assert engine.load(waiting).node("first").status == "ready"
    assert [e.type for e in one_connection.read_stream(ev.run_stream(waiting))] == [
        ev.RUN_STARTED,
        ev.NODES_READY,
    ]


def _finish_together(
    engine: Engine, runs: list[tuple[WorkflowWorker, Claim, RunState]]
) -> list[Claim | None]:
    wf = registry.get("diamond")
    barrier = threading.Barrier(len(runs), timeout=60)
    results: list[Claim | None] = [None] * len(runs)
    errors: list[BaseException] = []

    def finish(index: int, worker: WorkflowWorker, claim: Claim, run: RunState) -> None:
        try:
            barrier.wait()
            results[index] = worker.lifecycle.succeeded(
                claim, wf, 1, 0.001, claim_next=worker._claimant, run=run
            )
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(i, w, c, r)) for i, (w, c, r) in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    assert not errors, errors
    return results


@given(order=st.permutations([0, 1]))
def test_two_siblings_ending_at_once_start_their_dependent_exactly_once(
    store: EventStore, order: list[int]
) -> None:
    engine = Engine(store, registry)
    workers = [WorkflowWorker(engine, registry, SETTINGS, name=f"sibling-{i}") for i in range(2)]
    run_id = engine.start("diamond").run_id
    (source,) = workers[0]._claim(1)
    workers[0].lifecycle.succeeded(source, registry.get("diamond"), [1, 2, 3], 0.001)
    # Both siblings claimed, and both workers know the run at the same version before either ends.
    held = []
    for index in order:
        (claim,) = workers[index]._claim(1)
        held.append((workers[index], claim))
    version = engine.load(run_id).version
    runs = [(w, c, engine.load(run_id)) for w, c in held]
    assert all(r.version == version for _, _, r in runs)

    successors = _finish_together(engine, runs)

    assert [s.node for s in successors if s is not None] == ["join"]
    events = engine.store.read_stream(ev.run_stream(run_id))
    readied = [e for e in events if e.type == ev.NODES_READY and "join" in e.data["nodes"]]
    claims = [e for e in events if e.type == ev.NODE_CLAIMED and e.data["node"] == "join"]
    assert len(readied) == 1
    assert len(claims) == 1
    with engine.store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT status FROM ledgerflow.workflow_queue WHERE run_id = %s AND node = 'join'", (run_id,)
        ).fetchall()
    assert rows == [("claimed",)]
    # The one that lost the race read what it missed and holds the log's fold; the other one's copy is
    # the fold of a prefix of the log, and catches up to it.
    latest = engine.load(run_id)
    for (_, _, run), successor in zip(runs, successors, strict=True):
        assert (run == latest) == (successor is not None)
        assert engine.catch_up(run) == latest


def _claim_plan(conn: psycopg.Connection[Any], ready: int, plan_cache_mode: str) -> dict[str, int]:
    """The plan (ANALYZE, BUFFERS) of a worker's claim of 8 nodes with `ready` rows waiting, rolled back."""
    # Queue rows and their runs' streams (a claim appends its NodeClaimed to them).
    conn.execute(
        "WITH queued AS ("
        " INSERT INTO ledgerflow.workflow_queue (run_id, node, tenant, workflow, max_crashes, ready_at) "
        " SELECT gen_random_uuid(), 'first', 'default', w, 3, clock_timestamp() - make_interval(secs => i) "
        "   FROM generate_series(1, %s) AS i, unnest(ARRAY['linear', 'diamond']) AS w"
        " RETURNING run_id, tenant) "
        "INSERT INTO ledgerflow.streams (tenant, stream_id, version) "
        "SELECT tenant, 'wf-' || run_id, 1 FROM queued",
        (ready,),
    )
    conn.execute("ANALYZE ledgerflow.workflow_queue")
    from workflows.queries import Q

    # The claim runs inside ledgerflow.wf_claim: auto_explain hands its inner statement's plan to the
    # client as a notice.
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_analyze = on",
        "SET auto_explain.log_buffers = on",
        "SET auto_explain.log_format = json",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_level = notice",
        # The function's statement is planned for its parameters, or once for any (PL/pgSQL's plan cache
        # switches to a generic plan after a few calls): both must stay bounded.
        f"SET plan_cache_mode = {plan_cache_mode}",
    ):
        conn.execute(setting)
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    params = {
        "worker_name": "w",
        "instance": "i",
        "worker_id": "w/i",
        "workflows": ["linear"],
        "versions": ["1"],
        "limit": 8,
        "ttl": 30.0,
    }
    claimed = conn.execute(Q["claim"], params).fetchall()
    plans = [json.loads(n[n.index("{") :]) for n in notices if "plan:" in n]
    # The walks of the ready index are ledgerflow.wf_claim_pick's statements (each logged on its own): the
    # probes for the next tenant and a tenant's next priority, then each tenant's share.
    # (The claim's own statement is left out: its buffers count every statement it runs, the appends too.)
    walks = [
        p["Plan"]
        for p in plans
        if "ledgerflow.workflow_queue q" in p["Query Text"] and "WITH picked" not in p["Query Text"]
    ]
    assert walks
    buffers = sum(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] for plan in walks)
    scanned = sum(_index_rows(plan) for plan in walks)
    conn.rollback()
    return {"buffers": buffers, "index_rows": scanned, "claimed": len(claimed)}


def _index_rows(node: dict[str, object]) -> int:
    """Rows the plan read from the ready index."""
    own = 0
    if node.get("Index Name") == "workflow_queue_ready_fair":
        own = int(node["Actual Rows"]) * int(node.get("Actual Loops", 1))  # type: ignore[call-overload]
    children = node.get("Plans", [])
    assert isinstance(children, list)
    return own + sum(_index_rows(child) for child in children)


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_the_claim_reads_a_bounded_number_of_entries_whatever_the_backlog(
    database_url: str, plan_cache_mode: str
) -> None:
    with psycopg.connect(database_url) as conn:
        small = _claim_plan(conn, 1_000, plan_cache_mode)
        large = _claim_plan(conn, 10_000, plan_cache_mode)
    assert small["claimed"] == large["claimed"] == 8
    # Only the claimed rows are read from the index, and at most one each for the probes of the tenant
    # and its priority, whether 1,000 or 10,000 wait (and those of the other workflow are never stepped
    # over). (A probe the plan answers from the row it already holds reads none.)
    assert 8 <= small["index_rows"] <= 8 + 2
    assert 8 <= large["index_rows"] <= 8 + 2
    # A few more pages (a deeper index) for each of the walk's four probes, not more rows.
    assert large["buffers"] <= small["buffers"] + 15

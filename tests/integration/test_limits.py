"""Limits per key in the database: exact admission under concurrent claimers, slots freed by every end,
per-minute windows, nodes refused a slot that neither hold anything nor hold others back, and the
declaration workers make at start."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import EventStore
from tests.waiting import joined
from workflows import (
    Engine,
    NodeContext,
    Workflow,
    WorkflowRegistry,
    queue_claims,
    queue_node_ends,
    queue_run_changes,
)
from workflows import events as ev
from workflows.definition_checks import DefinitionError
from workflows.lifecycle import Lifecycle
from workflows.limits import declare, usage
from workflows.queue_claims import Claim, Claimant
from workflows.recovery import take_back


def _body(ctx: NodeContext) -> int:
    return 1


def make_registry(concurrency: int | None = 2, per_minute: int | None = None) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.limit("llm", concurrency=concurrency, per_minute=per_minute)
    lim = Workflow("lim")
    lim.node(name="call", limits=["llm"])(_body)
    free = Workflow("free")
    free.node(name="plain")(_body)
    chain = Workflow("chain")
    chain.node(name="prepare")(_body)
    chain.node(name="call", depends_on=["prepare"], limits=["llm"])(_body)
    for wf in (lim, free, chain):
        registry.register(wf)
    return registry


@pytest.fixture
def engine(store: EventStore) -> Iterator[Engine]:
    registry = make_registry()
    with store.pool.connection() as conn:
        declare(conn, registry, worker="test/1")
    return Engine(store, registry)


def set_limit(store: EventStore, concurrency: int | None, per_minute: int | None = None) -> None:
    with store.pool.connection() as conn:
        declare(conn, make_registry(concurrency, per_minute), worker="test/1")


def claim(
    store: EventStore, limit: int, workflows: tuple[str, ...] = ("lim", "free", "chain")
) -> list[Claim]:
    with store.pool.connection() as conn:
        return queue_claims.claim(
            conn, worker_name="w", instance="i1", workflows=[(w, "1") for w in workflows], limit=limit, ttl=30
        )


def claimed(store: EventStore, workflow: str = "lim") -> int:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledgerflow.workflow_queue WHERE status = 'claimed' AND workflow = %s",
            (workflow,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def in_use(store: EventStore) -> int:
    with store.pool.connection() as conn:
        return next(u.in_use for u in usage(conn) if u.name == "llm")


@settings(max_examples=12)
@given(
    concurrency=st.integers(1, 5),
    claimers=st.lists(st.integers(1, 4), min_size=2, max_size=6),
)
def test_concurrent_claimers_admit_exactly_the_limit(
    store: EventStore, engine: Engine, concurrency: int, claimers: list[int]
) -> None:
    with store.pool.connection() as conn:
        conn.execute("DELETE FROM ledgerflow.workflow_queue")
        conn.execute("DELETE FROM ledgerflow.workflow_limit_starts")
    set_limit(store, concurrency)
    nodes = 10
    for n in range(nodes):
        engine.start("lim", input={"n": n, "case": uuid.uuid4().hex})
    barrier = threading.Barrier(len(claimers), timeout=60)
    taken: list[Claim] = []
    lock = threading.Lock()

    def claimer(limit: int) -> None:
        with store.pool.connection() as conn:
            barrier.wait()  # every claim in flight at the same instant
            with conn.transaction():
                got = queue_claims.claim(
                    conn, worker_name="w", instance="i", workflows=[("lim", "1")], limit=limit, ttl=30
                )
        with lock:
            taken.extend(got)

    threads = [threading.Thread(target=claimer, args=(limit,)) for limit in claimers]
    for t in threads:
        t.start()
    for t in threads:
        joined(t)
    # Exactly as many as the limit allows: never more, and no slot left idle while claimers asked.
    assert len(taken) == claimed(store) == min(concurrency, nodes, sum(claimers))
    assert len({(c.run_id, c.node) for c in taken}) == len(taken)


def test_every_end_of_a_node_frees_its_slot(store: EventStore, engine: Engine) -> None:
    set_limit(store, 1)
    runs = [engine.start("lim", input={"n": n}).run_id for n in range(3)]
    (first,) = claim(store, 4)
    assert claim(store, 4) == []
    assert in_use(store) == 1
    with store.pool.connection() as conn:
        conn.execute("UPDATE ledgerflow.workflow_queue SET ready_at = clock_timestamp()")

    def now_ready() -> None:  # the refused rows were deferred a moment: make them due for the next step
        with store.pool.connection() as conn:
            conn.execute(
                "UPDATE ledgerflow.workflow_queue SET ready_at = clock_timestamp() WHERE status = 'ready'"
            )

    # Released (a worker stopping): the slot is free, the node ready again.
    with store.pool.connection() as conn:
        assert queue_run_changes.release(conn, first.run_id, first.node, first.token)
    now_ready()
    (second,) = claim(store, 4)
    # A retry scheduled: the slot is free while the node waits for its retry.
    with store.pool.connection() as conn:
        queue_node_ends.end_node(conn, second, retry_in=3600)()
    now_ready()
    (third,) = claim(store, 4)
    assert third.run_id != second.run_id or third.token != second.token
    # A lapsed lease taken back by recovery: the node is ready again, its slot free for one claim.
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE ledgerflow.workflow_queue SET lease_expires_at = clock_timestamp() - interval '1 second' "
            "WHERE token = %s",
            (third.token,),
        )
    assert queue_reclaim(store, engine)
    assert in_use(store) == 0
    now_ready()
    assert len(claim(store, 4, ("lim",))) == 1
    # Success: the row goes, and the slot with it.
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT run_id, node, tenant, workflow, attempt, token, cancel_requested, crashes, version "
            "FROM ledgerflow.workflow_queue WHERE status = 'claimed'"
        ).fetchone()
        assert row is not None
        queue_node_ends.end_node(conn, Claim(*row))()
    now_ready()
    assert len(claim(store, 4)) == 1
    # Cancelled: a claimed node ends at its next write; the waiting ones go at once.
    with store.pool.connection() as conn:
        for run_id in runs:
            queue_run_changes.cancel_run(conn, run_id)
    assert in_use(store) == 1  # still running until it notices
    assert all(u.waiting == 0 for u in usage_now(store))


def usage_now(store: EventStore) -> list[Any]:
    with store.pool.connection() as conn:
        return usage(conn)


def queue_reclaim(store: EventStore, engine: Engine) -> bool:
    from workflows import sweep

    report = sweep(engine, engine.registry, worker_name="recoverer", instance="r1")
    return report.reclaimed > 0


def test_per_minute_counts_starts_in_a_sliding_minute(store: EventStore, engine: Engine) -> None:
    set_limit(store, None, per_minute=3)
    for n in range(5):
        engine.start("lim", input={"n": n})
    first = claim(store, 5)
    assert len(first) == 3
    with store.pool.connection() as conn:
        for c in first:
            queue_node_ends.end_node(conn, c)()  # ended: no slot held, but their starts stay in the window
        conn.execute("UPDATE ledgerflow.workflow_queue SET ready_at = clock_timestamp()")
        assert claim(store, 5) == []
        due, oldest = conn.execute(
            "SELECT min(q.ready_at), (SELECT min(started_at) FROM ledgerflow.workflow_limit_starts) "
            "FROM ledgerflow.workflow_queue q WHERE q.status = 'ready'"
        ).fetchone() or (None, None)
        # The refused nodes are due when the oldest start leaves the window, not before.
        assert due is not None
        assert oldest is not None
        assert abs((due - oldest) - timedelta(minutes=1)) < timedelta(milliseconds=50)
        # A minute later (the starts moved back instead of waiting for one):
        conn.execute(
            "UPDATE ledgerflow.workflow_limit_starts SET started_at = started_at - interval '61 seconds'"
        )
        conn.execute("UPDATE ledgerflow.workflow_queue SET ready_at = clock_timestamp()")
    assert len(claim(store, 5)) == 2
    assert usage_now(store)[0].started_last_minute == 2


def test_nodes_refused_a_slot_do_not_hold_back_the_queue(store: EventStore, engine: Engine) -> None:
    set_limit(store, 1)
    for n in range(6):
        engine.start("lim", input={"n": n})
    frees = {engine.start("free", input={"n": n}).run_id for n in range(2)}
    got: list[Claim] = []
    for _ in range(4):  # the limited rows come first in ready order; refused once, they step aside
        got += claim(store, 2)
    assert frees <= {c.run_id for c in got}
    assert sum(c.workflow == "lim" for c in got) == 1


def test_a_successor_needing_a_slot_is_claimed_never_handed_over(store: EventStore, engine: Engine) -> None:
    set_limit(store, 1)
    runs = [engine.start("chain", input={"n": n}).run_id for n in range(2)]
    prepares = claim(store, 2, ("chain",))
    assert {c.node for c in prepares} == {"prepare"}
    wf = engine.registry.get("chain")
    claimant = Claimant("w", "i1", "w/i1", 30.0, workflows=(("chain", "1"),))
    lifecycle = Lifecycle(engine)
    handed = [lifecycle.succeeded(c, wf, 1, 0.0, claim_next=claimant) for c in prepares]
    # A node with limits is admitted by the claim: handing it over could record a claim nobody runs.
    assert handed == [None, None]
    assert claimed(store, "chain") == 0
    for run_id in runs:
        claims = [e for e in engine.store.read_stream(ev.run_stream(run_id)) if e.type == ev.NODE_CLAIMED]
        assert "call" not in [e.data["node"] for e in claims], "no claim recorded that nobody runs"
    (first,) = claim(store, 2, ("chain",))  # the limit admits one
    assert first.node == "call"
    assert in_use(store) == 1
    with store.pool.connection() as conn:
        queue_node_ends.end_node(conn, first)()
        conn.execute("UPDATE ledgerflow.workflow_queue SET ready_at = clock_timestamp()")
    (again,) = claim(store, 2, ("chain",))
    assert again.node == "call"
    assert {first.run_id, again.run_id} == set(runs)


def test_the_last_worker_to_start_wins_and_says_so(store: EventStore) -> None:
    with store.pool.connection() as conn:
        declare(conn, make_registry(4, 60), worker="a/1")
        with structlog.testing.capture_logs() as logs:
            declare(conn, make_registry(2), worker="b/1")
        (only,) = usage(conn)
    assert (only.concurrency, only.per_minute, only.declared_by) == (2, None, "b/1")
    redeclared = [e for e in logs if e["event"] == "workflow_limit_redeclared"]
    assert redeclared == [
        {
            "event": "workflow_limit_redeclared",
            "log_level": "warning",
            "limit": "llm",
            "concurrency": 2,
            "per_minute": None,
            "replaced_concurrency": 4,
            "replaced_per_minute": 60,
            "replaced_worker": "a/1",
        }
    ]


def test_a_node_that_no_longer_needs_a_limit_loses_it(store: EventStore) -> None:
    registry = make_registry()
    changed = WorkflowRegistry()
    changed.limit("llm", concurrency=2)
    lim = Workflow("lim")
    lim.node(name="call")(_body)  # this deploy dropped the node's limit
    changed.register(lim)
    with store.pool.connection() as conn:
        declare(conn, registry, worker="a/1")
        declare(conn, changed, worker="b/1")
        rows = conn.execute(
            "SELECT workflow, node FROM ledgerflow.workflow_node_limits ORDER BY 1"
        ).fetchall()
    assert rows == [("chain", "call")]


def test_a_node_naming_an_undeclared_limit_stops_the_declaration(store: EventStore) -> None:
    registry = WorkflowRegistry()
    wf = Workflow("lim")
    wf.node(name="call", limits=["gpu"])(_body)
    registry.register(wf)
    with store.pool.connection() as conn, pytest.raises(DefinitionError, match="gpu"):
        declare(conn, registry, worker="a/1")


def test_a_node_limited_in_any_version_is_limited_in_every_one(store: EventStore) -> None:
    registry = WorkflowRegistry()
    registry.limit("llm", concurrency=2)
    registry.limit("gpu", concurrency=1)
    for version, needs in (("1", ["gpu"]), ("2", ["llm"])):
        wf = Workflow("lim", version=version)
        wf.node(name="call", limits=needs)(_body)
        registry.register(wf)
    with store.pool.connection() as conn:
        declare(conn, registry, worker="a/1")
        rows = conn.execute("SELECT workflow, node, limits FROM ledgerflow.workflow_node_limits").fetchall()
    assert rows == [("lim", "call", ["gpu", "llm"])]


def test_recovery_never_claims_a_node_with_limits_for_the_recoverer(
    store: EventStore, engine: Engine
) -> None:
    """A node taken back from a dead worker is claimed for the recoverer only when it needs no slot: one
    with limits goes back to the queue, where the claim admits it (or not) like any other."""
    set_limit(store, 1)
    limited = engine.start("lim").run_id
    free = engine.start("free").run_id
    assert len(claim(store, 2)) == 2  # worker "w"/"i1" holds both; then it dies
    with store.pool.connection() as conn:  # its leases lapse
        conn.execute(
            "UPDATE ledgerflow.workflow_queue SET lease_expires_at = clock_timestamp() - interval '1s'"
        )
    recoverer = Claimant("r", "r1", "r/r1", 30.0)
    report, claims = take_back(engine, engine.registry, recoverer, slots=5)
    assert report.reclaimed == 2
    assert [c.run_id for c in claims] == [free]
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT status FROM ledgerflow.workflow_queue WHERE run_id = %s", (limited,)
        ).fetchone()
    assert row == ("ready",)
    assert in_use(store) == 0  # the dead worker's slot is free, and nobody holds one without admission

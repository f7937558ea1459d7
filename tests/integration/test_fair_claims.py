"""Fair claims on a real PostgreSQL (migration 0028): tenants are served in turn whatever one tenant's
backlog, higher priority is claimed first within a tenant, and no node is ever claimed twice."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Sequence

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import EventStore, InvalidInputError
from workflows import DefinitionError, Engine, NodeContext, Workflow, WorkflowRegistry, queue_claims

PAIRS = [("flat", "1")]


def _registry(priority: int = 0) -> WorkflowRegistry:
    wf = Workflow("flat", priority=priority)

    @wf.node()
    def only(ctx: NodeContext) -> None:
        return None

    registry = WorkflowRegistry()
    registry.register(wf)
    return registry


def _seed(conn: psycopg.Connection[object], tenant: str, count: int, priority: int = 0) -> None:
    """`count` ready one-node runs of `tenant` (queue rows and their run streams), due in insertion order."""
    conn.execute(
        "WITH queued AS ("
        " INSERT INTO ledgerflow.workflow_queue"
        "        (run_id, node, tenant, workflow, version, max_crashes, ready_at, priority)"
        " SELECT gen_random_uuid(), 'only', %(tenant)s, 'flat', '1', 3,"
        "        clock_timestamp() - interval '1 hour' + make_interval(secs => i), %(priority)s"
        "   FROM generate_series(1, %(count)s) AS i"
        " RETURNING run_id, tenant) "
        "INSERT INTO ledgerflow.streams (tenant, stream_id, version) "
        "SELECT tenant, 'wf-' || run_id, 1 FROM queued",
        {"tenant": tenant, "count": count, "priority": priority},
    )


def _claim(
    store: EventStore, limit: int, pairs: Sequence[queue_claims.WorkflowVersion] = PAIRS
) -> list[queue_claims.Claim]:
    with store.pool.connection() as conn:
        return queue_claims.claim(conn, worker_name="t", instance="t1", workflows=pairs, limit=limit, ttl=30)


def _event_count(store: EventStore) -> int:
    with store.pool.connection() as conn:
        (count,) = conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone() or (0,)
    return int(count)


def test_a_tenants_first_node_is_claimed_in_the_first_batch_behind_another_tenants_backlog(
    store: EventStore,
) -> None:
    with store.pool.connection() as conn:
        _seed(conn, "noisy", 2_000)
    started = Engine(store, _registry()).start("flat", tenant="quiet")
    claims = _claim(store, 8)
    assert len(claims) == 8
    assert [c.run_id for c in claims if c.tenant == "quiet"] == [started.run_id]


def test_claims_of_one_node_alternate_between_tenants(store: EventStore) -> None:
    with store.pool.connection() as conn:
        _seed(conn, "noisy", 2_000)
        _seed(conn, "quiet", 3)
    # The turn is the session's: one connection's claims go round the tenants.
    with psycopg.connect(store.url, autocommit=True) as conn:
        tenants = [
            c.tenant
            for _ in range(6)
            for c in queue_claims.claim(
                conn, worker_name="t", instance="t1", workflows=PAIRS, limit=1, ttl=30
            )
        ]
    # In turn, whichever tenant the first claim starts at.
    assert Counter(tenants) == {"noisy": 3, "quiet": 3}
    assert all(a != b for a, b in itertools.pairwise(tenants))


def test_higher_priority_is_claimed_first_within_a_tenant(store: EventStore) -> None:
    engine = Engine(store, _registry(priority=5))
    low = engine.start("flat", priority=-1).run_id
    default = engine.start("flat").run_id  # the workflow's: 5
    high = engine.start("flat", priority=9).run_id
    zero = engine.start("flat", priority=0).run_id
    # A start with a key takes the other path (a transaction): its rows carry the priority too.
    keyed = engine.start("flat", key="k", priority=7).run_id
    order = [c.run_id for _ in range(5) for c in _claim(store, 1)]
    assert order == [high, keyed, default, zero, low]
    assert engine.load(high).priority == 9
    assert engine.load(default).priority == 5
    assert engine.load(low).priority == -1


def test_priority_is_recorded_and_bad_priorities_are_refused(store: EventStore) -> None:
    engine = Engine(store, _registry())
    run_id = engine.start("flat", priority=3).run_id
    (started,) = [e for e in store.read_stream(f"wf-{run_id}") if e.type == "wf.RunStarted"]
    assert started.data["priority"] == 3
    plain = engine.start("flat").run_id
    (started,) = [e for e in store.read_stream(f"wf-{plain}") if e.type == "wf.RunStarted"]
    assert "priority" not in started.data  # a start without one writes the same payload as before
    before = _event_count(store)
    for bad in (True, 1.5, "1", 2**31):
        with pytest.raises(InvalidInputError, match="priority"):
            engine.start("flat", priority=bad)  # type: ignore[arg-type]
    assert _event_count(store) == before  # nothing written
    with pytest.raises(DefinitionError, match="priority"):
        Workflow("bad", priority=2**40)


def test_a_rebuilt_queue_row_takes_its_runs_priority_from_the_log(store: EventStore) -> None:
    engine = Engine(store, _registry())
    run_id = engine.start("flat", priority=4).run_id
    with store.pool.connection() as conn:
        conn.execute("DELETE FROM ledgerflow.workflow_queue WHERE run_id = %s", (run_id,))
        # Queued again without a priority (as a node's end queues successors): the trigger reads RunStarted.
        conn.execute(
            "INSERT INTO ledgerflow.workflow_queue (run_id, node, tenant, workflow, version, max_crashes) "
            "VALUES (%s, 'only', 'default', 'flat', '1', 3)",
            (run_id,),
        )
        (priority,) = conn.execute(
            "SELECT priority FROM ledgerflow.workflow_queue WHERE run_id = %s", (run_id,)
        ).fetchone() or (None,)
    assert priority == 4


def test_concurrent_claimers_never_claim_a_node_twice(store: EventStore) -> None:
    with store.pool.connection() as conn:
        for t in range(20):
            _seed(conn, f"t{t:02}", 15 if t % 2 else 3, priority=t % 3)
    total = 10 * 15 + 10 * 3
    claimed: list[tuple[uuid.UUID, str]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(limit: int) -> None:
        try:
            while True:
                got = _claim(store, limit)
                if not got:
                    return
                with lock:
                    claimed.extend((c.run_id, c.node) for c in got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(limit,)) for limit in (1, 3, 5, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert not errors
    assert len(claimed) == len(set(claimed)) == total
    with store.pool.connection() as conn:
        (tokens,) = conn.execute(
            "SELECT count(DISTINCT token) FROM ledgerflow.workflow_queue WHERE status = 'claimed'"
        ).fetchone() or (0,)
    assert tokens == total


@settings(max_examples=15, deadline=None)
@given(
    backlog=st.lists(st.tuples(st.integers(0, 12), st.integers(-1, 1)), min_size=1, max_size=5),
    limits=st.lists(st.integers(1, 9), min_size=1, max_size=6),
)
def test_each_claim_shares_its_limit_fairly_and_keeps_priority_order(
    store: EventStore, backlog: list[tuple[int, int]], limits: list[int]
) -> None:
    """Whatever the backlog: a claim gives tenants counts that differ by one at most unless a tenant ran
    out, within a tenant never a lower priority while a higher one is left ready, and each node once."""
    with store.pool.connection() as conn:
        conn.execute("TRUNCATE ledgerflow.workflow_queue")
        # Each tenant has rows of two priorities: the drawn one and one lower.
        for i, (count, priority) in enumerate(backlog):
            _seed(conn, f"t{i}", count, priority)
            _seed(conn, f"t{i}", count // 2, priority - 1)
        rows = conn.execute("SELECT run_id, tenant, priority FROM ledgerflow.workflow_queue").fetchall()
    tenant_of = {r: str(t) for r, t, _ in rows}
    priority_of = {r: int(p) for r, _, p in rows}
    left = Counter(tenant_of.values())
    seen: set[uuid.UUID] = set()
    for limit in [*limits, 1_000]:
        claims = _claim(store, limit)
        assert len(claims) == min(limit, len(priority_of) - len(seen))
        got = Counter(c.tenant for c in claims)
        for c in claims:
            assert c.run_id not in seen
            seen.add(c.run_id)
            left[c.tenant] -= 1
        for tenant, n in got.items():
            # Any tenant that still has rows after the claim had its share.
            assert all(n <= got[other] + 1 for other, k in left.items() if k > 0), (got, left)
            lowest = min(priority_of[c.run_id] for c in claims if c.tenant == tenant)
            unclaimed = [priority_of[r] for r, t in tenant_of.items() if t == tenant and r not in seen]
            assert all(p <= lowest for p in unclaimed)
    assert seen == set(priority_of)


def test_a_session_that_first_claimed_from_a_short_queue_finds_a_burst_by_key(store: EventStore) -> None:
    """A claim's plans are made once per session (migration 0080), against the queue of that moment. A
    session that first claimed from a queue of three rows still finds the rows it picks from a burst of
    2,000 by key, not by reading the whole queue (migration 0086; bench/claim_after_burst.py)."""
    with psycopg.connect(store.url, autocommit=True) as conn:
        _seed(conn, "t", 3)
        claimed = queue_claims.claim(conn, worker_name="t", instance="t1", workflows=PAIRS, limit=1, ttl=30)
        assert len(claimed) == 1
        _seed(conn, "t", 2_000)
        with conn.transaction():
            claimed = queue_claims.claim(
                conn, worker_name="t", instance="t1", workflows=PAIRS, limit=1, ttl=30
            )
            assert len(claimed) == 1
            # Sequential scans of the queue by this transaction, the claim's statements included.
            scans = conn.execute(
                "SELECT pg_stat_get_xact_numscans('ledgerflow.workflow_queue'::regclass)"
            ).fetchone()
        assert scans == (0,)

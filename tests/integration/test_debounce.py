"""Debounced starts: a burst of starts with one key makes one run, trailing edge (after the burst, with
its latest input), however many start at once and however many workers fire at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from structlog.testing import capture_logs

from eventstore import EventStore, InvalidInputError, QuotaExceededError
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Debounce, Engine, Quota, Started, TenantQuotas, pending_debounces
from workflows.debounce import fire_due


def runs_started(store: EventStore, workflow: str = "linear") -> list[dict[str, Any]]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT data FROM ledgerflow.events WHERE event_type = 'wf.RunStarted' "
            "AND data->>'workflow' = %s ORDER BY position",
            (workflow,),
        ).fetchall()
    return [r[0] for r in rows]


def all_due(store: EventStore) -> bool:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT bool_and(due_at <= clock_timestamp()) FROM ledgerflow.workflow_debounces"
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_concurrent_starts_make_one_run_with_the_latest_input(store: EventStore) -> None:
    engine = Engine(store, registry)
    threads, each = 16, 5
    barrier = threading.Barrier(threads)

    def burst(t: int) -> list[tuple[dict[str, int], Started]]:
        barrier.wait(timeout=30)
        inputs = [{"t": t, "i": i} for i in range(each)]
        return [
            (x, engine.start("linear", input=x, tenant="acme", debounce=Debounce("doc", 2.0))) for x in inputs
        ]

    with ThreadPoolExecutor(threads) as pool:
        sent = [pair for batch in pool.map(burst, range(threads)) for pair in batch]
    answers = [s for _, s in sent]
    assert {s.run_id for s in answers} == {answers[0].run_id}
    assert sum(s.created for s in answers) == 1  # the start that opened the burst
    [pending] = pending_debounces(store)
    assert pending.starts == threads * each
    assert pending.due_at == max(s.debounced_until for s in answers if s.debounced_until is not None)
    assert fire_due(engine, ["linear"]) == 0 or runs_started(store) == []  # not before its window
    wait_until(lambda: fire_due(engine, ["linear"]), timeout=30, what="the burst to fire")
    [run] = runs_started(store)
    assert run["run_id"] == str(answers[0].run_id)
    # The latest start's input: each thread's starts follow one another, so the last to write the row was
    # some thread's last start.
    assert run["input"]["i"] == each - 1
    assert pending_debounces(store) == []
    assert fire_due(engine, ["linear"]) == 0
    assert len(runs_started(store)) == 1
    # The next start opens a new burst, with a run of its own.
    after = engine.start("linear", input={"again": True}, tenant="acme", debounce=Debounce("doc", 0.05))
    assert after.created
    assert after.run_id != answers[0].run_id


def test_the_run_has_the_last_starts_input(store: EventStore) -> None:
    engine = Engine(store, registry)
    for i in range(5):
        engine.start("linear", input={"i": i}, tenant="acme", debounce=Debounce("k", 0.2))
    wait_until(lambda: fire_due(engine, ["linear"]), timeout=30, what="the burst to fire")
    [run] = runs_started(store)
    assert run["input"] == {"i": 4}


def test_many_workers_firing_at_once_start_one_run_per_burst(store: EventStore) -> None:
    engine = Engine(store, registry)
    bursts = {
        f"key-{k}": engine.start("linear", input={"k": k}, tenant="acme", debounce=Debounce(f"key-{k}", 0.1))
        for k in range(20)
    }
    wait_until(lambda: all_due(store), timeout=30, what="every burst to be due")
    barrier = threading.Barrier(4)

    def fire(_: int) -> int:
        barrier.wait(timeout=30)
        return fire_due(engine, ["linear"])

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(fire, range(4))) == 20
    runs = runs_started(store)
    assert sorted(r["run_id"] for r in runs) == sorted(str(s.run_id) for s in bursts.values())


def test_max_wait_bounds_a_burst_that_never_pauses(store: EventStore) -> None:
    engine = Engine(store, registry)
    first = engine.start("linear", tenant="acme", debounce=Debounce("k", 3600, max_wait=0.3))
    later = engine.start("linear", tenant="acme", debounce=Debounce("k", 3600, max_wait=0.3))
    assert first.debounced_until is not None
    assert later.debounced_until == first.debounced_until  # the deadline, not an hour after the start
    wait_until(lambda: fire_due(engine, ["linear"]), timeout=30, what="the burst to fire at its deadline")
    assert len(runs_started(store)) == 1


def test_keys_are_per_tenant_and_workflow(store: EventStore) -> None:
    engine = Engine(store, registry)
    a = engine.start("linear", tenant="acme", debounce=Debounce("k", 60))
    b = engine.start("linear", tenant="globex", debounce=Debounce("k", 60))
    c = engine.start("diamond", tenant="acme", debounce=Debounce("k", 60))
    assert len({a.run_id, b.run_id, c.run_id}) == 3
    assert a.created
    assert b.created
    assert c.created


@pytest.mark.parametrize(
    ("key", "window", "max_wait"),
    [("", 1.0, None), ("k\n", 1.0, None), ("k", 0.0, None), ("k", float("nan"), None), ("k", 1.0, -1.0)],
)
def test_bad_debounce_is_refused(key: str, window: float, max_wait: float | None) -> None:
    with pytest.raises(InvalidInputError):
        Debounce(key, window, max_wait)


def test_debounce_takes_no_run_key_and_writes_nothing(store: EventStore) -> None:
    engine = Engine(store, registry)
    for extra in ({"key": "k"}, {"idempotency_key": "i"}):
        with pytest.raises(InvalidInputError):
            engine.start("linear", tenant="acme", debounce=Debounce("d", 1), **extra)  # type: ignore[arg-type]
    assert pending_debounces(store) == []


def test_a_burst_over_its_tenants_runs_in_flight_waits(store: EventStore) -> None:
    quotas = TenantQuotas(store, Quota(max_runs_in_flight=1))
    engine = Engine(store, registry)
    engine.start("linear", tenant="acme")  # the one run acme may have in flight
    engine.start("linear", tenant="acme", debounce=Debounce("k", 0.05))
    wait_until(lambda: all_due(store), timeout=30, what="the burst to be due")
    assert fire_due(engine, ["linear"], quotas) == 0
    [pending] = pending_debounces(store)
    assert pending.due_at > pending.first_at  # postponed, not lost
    assert len(runs_started(store)) == 1
    with pytest.raises(QuotaExceededError):  # the same refusal a start would get now
        Engine(store, registry, quotas=quotas).start("linear", tenant="acme")


def test_a_burst_that_cannot_start_holds_up_no_other(store: EventStore) -> None:
    engine = Engine(store, registry)
    engine.start("linear", input={"burst": "a"}, tenant="acme", debounce=Debounce("a", 0.05))
    [a] = pending_debounces(store)
    # A run already holds the burst's idempotency key with other input: its start can only conflict.
    engine.start("linear", input={"other": True}, idempotency_key=f"debounce:{a.burst}", tenant="acme")
    engine.start("linear", input={"burst": "b"}, tenant="acme", debounce=Debounce("b", 0.05))
    wait_until(lambda: all_due(store), timeout=30, what="both bursts to be due")
    with capture_logs() as logs:
        assert fire_due(engine, ["linear"]) == 1
    assert [e["key"] for e in logs if e["event"] == "debounce_fire_failed"] == ["a"]
    assert [r["input"] for r in runs_started(store)] == [{"other": True}, {"burst": "b"}]
    [left] = pending_debounces(store)
    assert left.key == "a"
    assert not all_due(store)  # looked at again later


def test_a_debounced_start_over_the_start_rate_writes_nothing(store: EventStore) -> None:
    engine = Engine(store, registry, quotas=TenantQuotas(store, Quota(starts_per_second=0.01)))
    engine.start("linear", input={"n": 1}, tenant="acme", debounce=Debounce("k", 60))
    with pytest.raises(QuotaExceededError):
        engine.start("linear", input={"n": 2}, tenant="acme", debounce=Debounce("k", 60))
    [burst] = pending_debounces(store)
    assert burst.starts == 1

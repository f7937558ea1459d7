"""Per-tenant quotas: starts and appends per second (a token bucket per tenant in the database) and runs in
flight, both exact across processes sharing the database. Each refusal is a QuotaExceededError carrying
`retry_after`, and leaves the log and the queue as they were."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from eventstore import EventStore, QuotaExceededError, open_store
from eventstore.settings import DatabaseSettings
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, Quota, TenantQuotas, clear_tenant_quota, set_tenant_quota
from workflows.testing import running_worker, wait_for_run


class Clock:
    """A clock the test moves: token buckets refill only when it says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def written(store: EventStore) -> tuple[int, int]:
    """Events in the log and rows in the queue: what a refused request must not change."""
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM ledgerflow.events), "
            "(SELECT count(*) FROM ledgerflow.workflow_queue)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.fixture
def second_store(database_url: str) -> Iterator[EventStore]:
    """Another process's store: its own pool, sessions and quota buckets."""
    other = open_store(DatabaseSettings(database_url=database_url))
    try:
        yield other
    finally:
        other.close()


def test_starts_per_second_refuse_with_retry_after_and_write_nothing(store: EventStore) -> None:
    clock = Clock()
    quotas = TenantQuotas(store, Quota(starts_per_second=2), clock=clock)
    engine = Engine(store, registry, quotas=quotas)
    engine.start("linear", tenant="acme")
    engine.start("linear", tenant="acme")  # a bucket holds one second's worth: two starts
    before = written(store)
    with pytest.raises(QuotaExceededError) as refused:
        engine.start("linear", tenant="acme")
    assert refused.value.quota == "starts_per_second"
    assert refused.value.retry_after == pytest.approx(0.5)
    assert "LEDGERFLOW_TENANT_STARTS_PER_SECOND" in str(refused.value)
    assert refused.value.details() == {"quota": "starts_per_second", "limit": 2, "retry_after": 0.5}
    assert written(store) == before
    engine.start("linear", tenant="globex")  # another tenant has its own bucket
    clock.now += 0.5
    assert engine.start("linear", tenant="acme").created


def test_appends_per_second(store: EventStore) -> None:
    clock = Clock()
    quotas = TenantQuotas(store, Quota(appends_per_second=10), burst=0.2, clock=clock)
    quotas.take_append("acme")
    quotas.take_append("acme")
    with pytest.raises(QuotaExceededError) as refused:
        quotas.take_append("acme")
    assert refused.value.quota == "appends_per_second"
    assert refused.value.retry_after == pytest.approx(0.1)
    quotas.take_append("globex")
    clock.now += 0.1
    quotas.take_append("acme")


@pytest.mark.parametrize("quota", ["appends_per_second", "starts_per_second"])
def test_rates_hold_across_processes(store: EventStore, second_store: EventStore, quota: str) -> None:
    """40 takes at once from two processes' quotas (their own pools and sessions), on the database's clock,
    against one tenant's bucket of 20 tokens that refills one token in 100 s: exactly 20 admitted, and
    another tenant's bucket untouched."""
    rate = 0.01
    each = [TenantQuotas(s, Quota(**{quota: rate}), burst=20 / rate) for s in (store, second_store)]
    barrier = threading.Barrier(40)

    def take(i: int) -> bool:
        quotas = each[i % 2]
        barrier.wait(timeout=30)
        try:
            if quota == "appends_per_second":
                quotas.take_append("acme")
            else:
                quotas.take_start("acme")
        except QuotaExceededError as refused:
            return refused.retry_after <= 0  # a refusal always says when to come back
        return True

    with ThreadPoolExecutor(40) as pool:
        outcomes = list(pool.map(take, range(40)))
    assert sum(outcomes) == 20
    with pytest.raises(QuotaExceededError) as refused:  # the other process's bucket is the same one
        (each[1].take_append if quota == "appends_per_second" else each[1].take_start)("acme")
    assert 0 < refused.value.retry_after <= 1 / rate
    (each[0].take_append if quota == "appends_per_second" else each[0].take_start)("globex")


def bucket_tokens(store: EventStore, tenant: str) -> float:
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT tokens FROM ledgerflow.tenant_rate_buckets WHERE tenant = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return float(row[0])


def test_high_rates_take_tokens_a_few_at_a_time(store: EventStore, second_store: EventStore) -> None:
    """At 1,000 appends a second a take asks for 50 ms' worth (here the whole bucket of 20): the process
    spends them without asking again, and the other process finds the bucket empty; with time standing
    still, no more than the bucket's 20 are ever spent."""
    clock = Clock()
    one, other = (
        TenantQuotas(s, Quota(appends_per_second=1000), burst=0.02, clock=clock)
        for s in (store, second_store)
    )
    one.take_append("acme")
    assert bucket_tokens(store, "acme") == 0  # one statement took all 20
    for _ in range(19):
        one.take_append("acme")  # spent from what the process holds: no statement
    with pytest.raises(QuotaExceededError):
        one.take_append("acme")
    with pytest.raises(QuotaExceededError) as refused:
        other.take_append("acme")
    assert refused.value.retry_after == pytest.approx(0.001)
    clock.now += 0.005  # 5 tokens more, for whoever asks first
    admitted = 0
    for quotas in (other, one, other, one):
        for _ in range(5):
            try:
                quotas.take_append("acme")
                admitted += 1
            except QuotaExceededError:
                pass
    assert admitted == 5


def test_no_quota_costs_nothing(store: EventStore) -> None:
    quotas = TenantQuotas(store)
    engine = Engine(store, registry, quotas=quotas)
    for _ in range(50):
        engine.start("linear", tenant="acme")
        quotas.take_append("acme")
    with store.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.tenant_rate_buckets").fetchone()
    assert row == (0,), "a tenant without rate quotas took tokens"


def test_runs_in_flight_refused_until_one_ends(store: EventStore) -> None:
    engine = Engine(store, registry, quotas=TenantQuotas(store, Quota(max_runs_in_flight=2)))
    first = engine.start("linear", tenant="acme")
    engine.start("linear", tenant="acme", key="k")  # every kind of start is admitted the same way
    before = written(store)
    with pytest.raises(QuotaExceededError) as refused:
        engine.start("linear", tenant="acme", idempotency_key="third")
    assert refused.value.quota == "max_runs_in_flight"
    assert refused.value.retry_after > 0
    assert "LEDGERFLOW_TENANT_MAX_RUNS_IN_FLIGHT" in str(refused.value)
    assert written(store) == before
    # An active run returned for its key or idempotency key is no new run: no quota refuses it.
    assert not engine.start("linear", tenant="acme", key="k").created
    engine.start("linear", tenant="globex")  # another tenant's runs do not count
    engine.cancel(first.run_id, tenant="acme")  # nothing running: the run ends now
    assert engine.start("linear", tenant="acme").created


def test_runs_in_flight_hold_across_processes(store: EventStore, second_store: EventStore) -> None:
    """16 starts at once from two processes' engines, 5 places: exactly 5 runs."""
    engines = [
        Engine(s, registry, quotas=TenantQuotas(s, Quota(max_runs_in_flight=5)))
        for s in (store, second_store)
    ]
    barrier = threading.Barrier(16)

    def start(i: int) -> bool:
        barrier.wait(timeout=30)
        try:
            engines[i % 2].start("linear", tenant="acme")
        except QuotaExceededError:
            return False
        return True

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(start, range(16)))
    assert sum(outcomes) == 5
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(DISTINCT run_id) FROM ledgerflow.workflow_queue WHERE tenant = 'acme'"
        ).fetchone()
    assert row is not None
    assert row[0] == 5


def test_admission_of_one_tenant_never_waits_for_another(store: EventStore, second_store: EventStore) -> None:
    """A start of acme holding its admission lock (its transaction still open) does not delay globex."""
    quotas = TenantQuotas(store, Quota(max_runs_in_flight=5))
    with store.pool.connection() as conn, conn.transaction():
        quotas.admit_run(conn, "acme", 5)
        other = Engine(second_store, registry, quotas=TenantQuotas(second_store, Quota(max_runs_in_flight=5)))
        done = threading.Event()

        def start_globex() -> None:
            other.start("linear", tenant="globex")
            done.set()

        threading.Thread(target=start_globex, daemon=True).start()
        wait_until(done.is_set, timeout=30, what="globex's start while acme's admission is open")


def test_a_tenants_own_row_overrides_the_settings(store: EventStore) -> None:
    set_tenant_quota(store, "acme", Quota(max_runs_in_flight=1))
    quotas = TenantQuotas(store, Quota(max_runs_in_flight=100), refresh=0.0)
    engine = Engine(store, registry, quotas=quotas)
    engine.start("linear", tenant="acme")
    with pytest.raises(QuotaExceededError) as refused:
        engine.start("linear", tenant="acme")
    assert "tenant_quotas" in str(refused.value)
    engine.start("linear", tenant="globex")
    engine.start("linear", tenant="globex")
    clear_tenant_quota(store, "acme")
    engine.start("linear", tenant="acme")  # back to the setting's 100


def test_continuations_count_against_the_starts_rate_and_are_never_refused(store: EventStore) -> None:
    """A chain of continue_as_new runs under a rate of one start a second and one run in flight: every
    successor starts (none is refused, by either quota), and each takes its token, so the tenant's next
    start waits for the debt to be paid back."""
    clock = Clock()
    quotas = TenantQuotas(store, Quota(max_runs_in_flight=1, starts_per_second=1), clock=clock)
    engine = Engine(store, registry, quotas=quotas)
    first = engine.start("countdown", input={"n": 3}, tenant="acme").run_id
    with running_worker(engine, registry):
        last = wait_for_run(engine, first, tenant="acme", follow=True)
    assert last.status == "succeeded"
    assert last.input == {"n": 0}
    # One start and three successors against one token, the clock still: three tokens in debt.
    with pytest.raises(QuotaExceededError) as refused:
        engine.start("linear", tenant="acme")
    assert refused.value.quota == "starts_per_second"
    assert refused.value.retry_after == pytest.approx(4.0)
    clock.now += 3.5
    with pytest.raises(QuotaExceededError):
        engine.start("linear", tenant="acme")
    clock.now += 0.5
    assert engine.start("linear", tenant="acme").created

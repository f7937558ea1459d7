"""The API's operator job queue: per tenant, one running job per tenant, the server administrator's
first, bounded per tenant. Real threads; every wait has a timeout."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from ops.api.jobs import SERVER, BackgroundJobs, JobQueueFullError

WAIT = 30.0


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Opened at the end of every test, so no held job outlives it."""
    opened = threading.Event()
    yield opened
    opened.set()


def held(gate: threading.Event, started: threading.Event | None = None) -> Callable[[], None]:
    """A slow job: runs until the gate opens."""

    def job() -> None:
        if started is not None:
            started.set()
        assert gate.wait(WAIT)

    return job


def test_a_slow_tenant_does_not_keep_another_tenants_job_from_starting(gate: threading.Event) -> None:
    jobs = BackgroundJobs(threads=2)
    a_started = [threading.Event() for _ in range(3)]
    a = [jobs.submit("slow", held(gate, s), lane="tenant-a") for s in a_started]
    assert a_started[0].wait(WAIT)
    b_started = threading.Event()
    b = jobs.submit("quick", lambda: b_started.set(), lane="tenant-b")
    # B's job runs while A's first still runs, on the thread A's second would have taken first come
    # first served: at most one of A's jobs runs at a time.
    assert b_started.wait(WAIT)
    b.result(WAIT)
    assert not a_started[1].is_set()
    assert not a[0].done()
    gate.set()
    for f in a:
        f.result(WAIT)
    assert all(s.is_set() for s in a_started)
    jobs.shutdown()


def test_the_server_administrators_job_goes_ahead_of_the_tenants(gate: threading.Event) -> None:
    jobs = BackgroundJobs(threads=1)
    started = threading.Event()
    jobs.submit("hold", held(gate, started), lane="tenant-a")
    assert started.wait(WAIT)
    order: list[str] = []
    queued = [
        jobs.submit("b", lambda: order.append("tenant-b"), lane="tenant-b"),
        jobs.submit("c", lambda: order.append("tenant-c"), lane="tenant-c"),
        jobs.submit("ops", lambda: order.append("server"), lane=SERVER),
    ]
    gate.set()
    for f in queued:
        f.result(WAIT)
    assert order == ["server", "tenant-b", "tenant-c"]
    jobs.shutdown()


def test_tenants_take_turns(gate: threading.Event) -> None:
    jobs = BackgroundJobs(threads=1)
    started = threading.Event()
    jobs.submit("hold", held(gate, started), lane="ops-hold")
    assert started.wait(WAIT)
    order: list[str] = []
    futures = [jobs.submit("a", lambda: order.append("a"), lane="tenant-a") for _ in range(3)]
    futures.append(jobs.submit("b", lambda: order.append("b"), lane="tenant-b"))
    gate.set()
    for f in futures:
        f.result(WAIT)
    assert order == ["a", "b", "a", "a"]  # B's one job does not wait behind A's three
    jobs.shutdown()


def test_a_full_queue_refuses_its_tenant_only(gate: threading.Event) -> None:
    jobs = BackgroundJobs(threads=1, max_queued=2, retry_after=7)
    started = threading.Event()
    jobs.submit("hold", held(gate, started), lane="tenant-a")
    assert started.wait(WAIT)
    waiting = [jobs.submit("q", lambda: None, lane="tenant-a") for _ in range(2)]
    with pytest.raises(JobQueueFullError) as refused:
        jobs.submit("q", lambda: None, lane="tenant-a")
    assert refused.value.details() == {"queued": 2, "retry_after": 7}
    assert "LEDGERFLOW_API_MAX_QUEUED_JOBS" in str(refused.value)
    other = [jobs.submit("q", lambda: None, lane="tenant-b") for _ in range(2)]
    gate.set()
    for f in waiting + other:
        f.result(WAIT)
    jobs.submit("q", lambda: None, lane="tenant-a").result(WAIT)  # room again once they ran
    jobs.shutdown()


def test_shutdown_runs_what_is_queued(gate: threading.Event) -> None:
    jobs = BackgroundJobs(threads=1)
    done: list[int] = []
    futures = [jobs.submit("q", lambda i=i: done.append(i), lane="tenant-a") for i in range(3)]
    jobs.shutdown()
    assert done == [0, 1, 2]
    assert all(f.done() for f in futures)

"""Drills of runs started by the log and by schedules, on real `ledgerflow worker` processes killed with
SIGKILL: every matching event (also those appended before any worker ran) starts exactly one run,
recording its cursor, and every run completes; every schedule tick has at most one run, none is lost while
a worker runs, and ticks missed while none ran follow the catch-up policy."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore, NewEvent, RecordedEvent
from projector import ProjectorWorker, WorkerSettings, rebuild
from projector.digest import projection_digest
from tests.acceptance.drill_workers import kill
from tests.acceptance.drill_workers import start_worker as drill_worker
from tests.waiting import wait_until
from workflows import workflow_tables
from workflows.triggers import projection_name

pytestmark = pytest.mark.drill
LEASE_TTL = 2.0


def create_calls_table(store: EventStore) -> None:
    """The table the test nodes record their calls in (see tests.flows.record_call), made before the
    workers start: nodes creating it at the same moment would collide."""
    with store.pool.connection() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.calls (run_id uuid, what text, attempt int, pid int, "
            "at timestamptz DEFAULT clock_timestamp())"
        )


def start_worker(url: str, name: str, log: Path, registry: str) -> subprocess.Popen[bytes]:
    return drill_worker(url, name, log, lease_ttl=LEASE_TTL, workflows=registry)


def stop(workers: dict[str, subprocess.Popen[bytes]]) -> None:
    for w in workers.values():
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    for w in workers.values():
        w.wait(timeout=30)


def query(store: EventStore, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with store.pool.connection() as conn:
        return conn.execute(text, params).fetchall()


def started(store: EventStore, workflow: str) -> list[dict[str, Any]]:
    """The RunStarted payloads of `workflow`, in log order."""
    rows = query(
        store,
        "SELECT data FROM ledgerflow.events WHERE event_type = 'wf.RunStarted' AND data->>'workflow' = %s "
        "ORDER BY position",
        (workflow,),
    )
    return [r[0] for r in rows]


def completions(store: EventStore) -> dict[str, int]:
    """How many times each run completed, by run id."""
    rows = query(
        store,
        "SELECT data->>'run_id', count(*) FROM ledgerflow.events WHERE event_type = 'wf.RunCompleted' "
        "GROUP BY 1",
    )
    return {r[0]: int(r[1]) for r in rows}


def db_now(store: EventStore) -> datetime:
    return query(store, "SELECT clock_timestamp()")[0][0]  # type: ignore[no-any-return]


def trigger_holder(store: EventStore) -> str | None:
    """The worker name whose consumer holds the trigger's lease now."""
    rows = query(
        store,
        "SELECT owner FROM ledgerflow.projection_leases WHERE projection = %s AND expires_at > now()",
        (projection_name("on_order"),),
    )
    return rows[0][0].split("/")[0] if rows else None


def assert_tables_equal_rebuild(store: EventStore) -> None:
    projector = ProjectorWorker(store, [workflow_tables], WorkerSettings(batch_size=500))
    try:
        projector.run_until_caught_up(timeout=120)
        with store.pool.connection() as conn:
            live = projection_digest(conn, workflow_tables, workflow_tables.schema)
        assert rebuild(store, workflow_tables).digest == live
    finally:
        projector.release_all()


def test_sigkill_while_a_trigger_delivers(store: EventStore, tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    registry = "tests.starts_flows:triggered"
    create_calls_table(store)
    appended: list[RecordedEvent] = []

    def append(first: int, last: int) -> None:
        # Paced, so that the workers deliver while events still arrive and a kill lands mid-delivery.
        for i in range(first, last):
            result = store.append(f"order-{i}", [NewEvent("OrderPlaced", {"total": i})])
            appended.append(store.read_stream(f"order-{i}", limit=1)[0])
            assert result.events[0].position == appended[-1].position
            if i % 25 == 0:
                threading.Event().wait(0.05)

    append(0, 50)  # before any worker runs: their runs start once one does
    workers = {n: start_worker(store.url, n, log, registry) for n in ("t1", "t2")}
    appender = threading.Thread(target=append, args=(50, 500))
    appender.start()
    rng = random.Random(12)
    delivered_at_kill = []

    def runs_reach(n: int) -> Callable[[], bool]:
        return lambda: len(started(store, "on_order")) >= n

    try:
        for threshold in (80, 220, 360):
            wait_until(runs_reach(threshold), timeout=60, what=f"{threshold} runs")
            holder = wait_until(lambda: trigger_holder(store), timeout=30, what="a trigger lease holder")
            assert holder is not None
            threading.Event().wait(rng.uniform(0, 0.05))  # an arbitrary moment of the delivery
            delivered_at_kill.append(len(started(store, "on_order")))
            kill(workers[holder])
            workers[holder] = start_worker(store.url, holder, log, registry)
        appender.join(timeout=60)
        wait_until(lambda: sum(completions(store).values()) >= 500, timeout=120, what="500 runs to complete")
    finally:
        stop(workers)
    assert min(delivered_at_kill) < 500, "no kill landed while the trigger delivered"
    runs = started(store, "on_order")
    assert len(runs) == 500
    by_event = {r["triggered_by"]["event_id"]: r for r in runs}
    assert set(by_event) == {str(e.event_id) for e in appended}
    for e in appended:
        recorded = by_event[str(e.event_id)]
        assert recorded["triggered_by"]["position"] == e.position
        assert recorded["triggered_by"]["transaction_id"] == e.transaction_id
        assert recorded["input"]["data"] == {"total": e.data["total"]}
    done = completions(store)
    assert {r["run_id"] for r in runs} == set(done)
    assert set(done.values()) == {1}
    [(rows,)] = query(store, f"SELECT count(*) FROM ledgerflow.{projection_name('on_order')}")
    assert rows == 500
    assert_tables_equal_rebuild(store)


def ticks_of(store: EventStore, workflow: str) -> list[datetime]:
    return [datetime.fromisoformat(r["input"]["tick"]) for r in started(store, workflow)]


def last_tick(store: EventStore, workflow: str) -> datetime:
    return query(  # type: ignore[no-any-return]
        store, "SELECT last_tick FROM ledgerflow.workflow_schedules WHERE workflow = %s", (workflow,)
    )[0][0]


def keepers_started(log: Path, processes: int) -> Callable[[], bool]:
    """Whether this many worker processes have started their schedules (each says so once)."""
    return lambda: log.read_text().count('"event": "schedules_started"') >= processes


def contiguous(ticks: list[datetime]) -> bool:
    ordered = sorted(ticks)
    return all(b - a == timedelta(seconds=1) for a, b in pairwise(ordered))


def test_schedules_across_ticks_with_two_workers_sigkill_and_a_downtime(
    store: EventStore, tmp_path: Path
) -> None:
    log = tmp_path / "workers.log"
    registry = "tests.starts_flows:scheduled"
    create_calls_table(store)
    workers = {n: start_worker(store.url, n, log, registry) for n in ("s1", "s2")}
    rng = random.Random(4)

    def ticks_reach(n: int) -> Callable[[], bool]:
        return lambda: len(ticks_of(store, "every_second")) >= n

    try:
        wait_until(lambda: len(ticks_of(store, "every_second")) >= 3, timeout=60, what="the first ticks")
        # SIGKILL across ticks: one worker dies just before, at or just after a tick, three times; the
        # other goes on, and takes every tick the dead one left.
        launched = 2
        for _ in range(3):
            # Only while the other worker's schedules run: with both down, ticks are missed by design.
            wait_until(keepers_started(log, launched), timeout=60, what="both workers' schedules")
            to_next_second = 1 - (time.time() % 1)
            threading.Event().wait(max(0.0, to_next_second + rng.uniform(-0.03, 0.03)))
            victim = rng.choice(sorted(workers))
            kill(workers[victim])
            workers[victim] = start_worker(store.url, victim, log, registry)
            launched += 1
            wait_until(ticks_reach(len(ticks_of(store, "every_second")) + 2), timeout=60, what="ticks")
        # Everything down for six seconds or more.
        for w in workers.values():
            kill(w)
        down_at = db_now(store)
        wait_until(lambda: db_now(store) >= down_at + timedelta(seconds=6), timeout=30, what="the downtime")
        # Read at the end of the downtime: a COMMIT a killed worker had already sent may land after its death.
        before = {wf: max(ticks_of(store, wf)) for wf in ("every_second", "every_second_skip")}
        assert before == {wf: last_tick(store, wf) for wf in before}  # the runs and the schedule agree
        workers = {"s1": start_worker(store.url, "s1", log, registry)}
        wait_until(
            lambda: len([t for t in ticks_of(store, "every_second") if t > before["every_second"]]) >= 5,
            timeout=60,
            what="ticks after the restart",
        )
        wait_until(
            lambda: len(completions(store)) >= len(started(store, "every_second")), timeout=60, what="runs"
        )
    finally:
        stop(workers)

    all_ticks, skip_ticks = ticks_of(store, "every_second"), ticks_of(store, "every_second_skip")
    assert len(all_ticks) == len(set(all_ticks)), "a tick ran twice"
    assert len(skip_ticks) == len(set(skip_ticks)), "a tick ran twice"
    # While a worker ran, no tick was lost, whoever was killed at it. (A "skip" schedule may lose a tick
    # whenever its worker looks more than a second late, as on a loaded machine: that is its policy.)
    assert contiguous([t for t in all_ticks if t <= before["every_second"]])
    # After the downtime: "all" started the last three missed ticks, "skip" only the last one; then on.
    after_all = [t for t in all_ticks if t > before["every_second"]]
    after_skip = [t for t in skip_ticks if t > before["every_second_skip"]]
    assert contiguous(after_all)  # ("skip" goes on too, but loses a tick whenever its worker looks late)
    assert min(after_all) - before["every_second"] >= timedelta(seconds=6 - 3)
    # "all" went two ticks further back than "skip" (exactly 2 s when both look at the same instant; more
    # when a loaded machine has "skip" look later); the cap on how far "all" goes back is checked above.
    assert min(after_skip) - min(after_all) >= timedelta(seconds=2)
    done = completions(store)
    assert set(done.values()) == {1}

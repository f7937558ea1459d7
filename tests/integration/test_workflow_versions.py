"""Versions on a real PostgreSQL: queue rows carry their run's version, the claim takes only versions the
claimer has, and a worker goes on with the version a run started with."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from eventstore import EventStore
from tests.waiting import wait_until
from workflows import (
    Engine,
    NodeContext,
    WorkerSettings,
    Workflow,
    WorkflowRegistry,
    WorkflowWorker,
    queue_claims,
)


def _flow(version: str) -> Workflow:
    wf = Workflow("changing", version=version)

    @wf.node()
    def first(ctx: NodeContext) -> str:
        return version

    @wf.node(depends_on=["first"])
    def second(ctx: NodeContext) -> list[str]:
        return [str(ctx.outputs["first"]), version]

    return wf


def registry_of(*versions: str) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    for v in versions:
        registry.register(_flow(v))
    return registry


def queue_versions(store: EventStore, run_id: uuid.UUID) -> list[tuple[str, str]]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT node, version FROM ledgerflow.workflow_queue WHERE run_id = %s ORDER BY node", (run_id,)
        ).fetchall()
    return [(str(n), str(v)) for n, v in rows]


def claim(store: EventStore, pairs: list[tuple[str, str]]) -> list[queue_claims.Claim]:
    with store.pool.connection() as conn, conn.transaction():
        return queue_claims.claim(conn, worker_name="t", instance="t1", workflows=pairs, limit=10, ttl=30)


FAST = WorkerSettings(concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2)


@pytest.fixture
def worker_of(store: EventStore) -> Iterator[Any]:
    started: list[tuple[WorkflowWorker, threading.Thread]] = []

    def start(registry: WorkflowRegistry) -> WorkflowWorker:
        w = WorkflowWorker(
            Engine(store, registry),
            registry,
            WorkerSettings(
                concurrency=2, lease_ttl=5, heartbeat_interval=1, poll_interval=0.1, shutdown_grace=2
            ),
            name=f"w-{len(started)}",
        )
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        started.append((w, t))
        return w

    yield start
    for w, t in started:
        w.stop()
        t.join(15)


def test_queue_rows_carry_the_version_their_run_started_with(store: EventStore) -> None:
    old = Engine(store, registry_of("1")).start("changing").run_id
    new = Engine(store, registry_of("1", "2")).start("changing").run_id
    assert queue_versions(store, old) == [("first", "1")]
    assert queue_versions(store, new) == [("first", "2")]
    assert claim(store, [("changing", "3")]) == []
    (got,) = claim(store, [("changing", "2")])
    assert (got.run_id, got.version) == (new, "2")
    (got,) = claim(store, [("changing", "1"), ("changing", "2")])
    assert (got.run_id, got.version) == (old, "1")


def test_each_run_goes_on_with_its_own_version(store: EventStore, worker_of: Any) -> None:
    old = Engine(store, registry_of("1")).start("changing").run_id
    both = registry_of("1", "2")
    engine = Engine(store, both)
    new = engine.start("changing").run_id
    worker_of(both)
    wait_until(lambda: not engine.load(old).active and not engine.load(new).active, what="both runs end")
    assert engine.load(old).nodes["second"].output == ["1", "1"]
    assert engine.load(new).nodes["second"].output == ["2", "2"]


def test_a_worker_without_the_version_leaves_the_run_alone(store: EventStore, worker_of: Any) -> None:
    old = Engine(store, registry_of("1")).start("changing").run_id
    only_new = registry_of("2")
    engine = Engine(store, only_new)
    marker = engine.start("changing").run_id  # a version-2 run: once it is done, the worker has claimed
    worker_of(only_new)
    wait_until(lambda: not engine.load(marker).active, what="the version-2 run ends")
    assert engine.load(old).status == "running"
    assert queue_versions(store, old) == [("first", "1")]
    with store.pool.connection() as conn:
        row = conn.execute(
            "SELECT status FROM ledgerflow.workflow_queue WHERE run_id = %s", (old,)
        ).fetchone()
    assert row == ("ready",)

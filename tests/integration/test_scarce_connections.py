"""A process with few connections: no thread holds one while it waits for another, a workflow worker
with a single pooled connection runs its nodes to the end, and a stopping process waits for the database
no longer than its allowance."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import psycopg_pool
import pytest
from psycopg import conninfo, sql

from eventstore import DatabaseSettings, NewEvent, open_store
from eventstore.pooling import Pool, bounded_waits
from tests.flows import registry
from tests.waiting import wait_until
from workflows import Engine, WorkerSettings, WorkflowWorker


def test_a_thread_that_keeps_a_pinned_connection_gives_it_back_before_it_checks_out(
    database_url: str,
) -> None:
    """With one connection in the pool, a thread that appended (and keeps that connection pinned) then
    asks the pool for a connection: it would wait for itself until the pool's timeout."""
    settings = DatabaseSettings(pool_min_size=1, pool_max_size=1, pinned_connections=1)
    with open_store(settings, url=database_url, migrate=False) as store:
        store.append("s", [NewEvent("Happened", {"n": 1})])
        assert store._pins.held == 1  # the append pinned the only connection
        began = time.monotonic()
        with store.pool.connection(timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert time.monotonic() - began < 2.5
        assert store._pins.held == 0
        store.append("s", [NewEvent("Happened", {"n": 2})])  # and it pins again
        assert [e.data["n"] for e in store.read_stream("s")] == [1, 2]


def test_a_worker_with_one_pooled_connection_finishes_every_run(database_url: str) -> None:
    """Four node threads, one connection: each holds it only for a statement or a transaction and never
    asks for a second while it holds one, so every run completes (a node thread holding its pin and
    waiting for another connection would stall until the pool's timeout, and its lease would lapse)."""
    settings = DatabaseSettings(pool_min_size=1, pool_max_size=1, pinned_connections=1)
    with open_store(settings, url=database_url, migrate=False) as store:
        store.pool.timeout = 8.0  # a stall shows as a PoolTimeout well within the wait below
        engine = Engine(store, registry)
        runs = [engine.start("diamond", input={}).run_id for _ in range(6)]
        worker = WorkflowWorker(
            engine,
            registry,
            WorkerSettings(concurrency=4, lease_ttl=5.0, heartbeat_interval=0.5, recovery=False),
            name="single",
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            wait_until(
                lambda: all(not engine.load(r).active for r in runs), timeout=60, what="every run to end"
            )
        finally:
            worker.stop()
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert [engine.load(r).status for r in runs] == ["succeeded"] * len(runs)


def test_bounded_waits_end_every_checkout_at_the_deadline(database_url: str) -> None:
    settings = DatabaseSettings(pool_min_size=1, pool_max_size=1)
    with open_store(settings, url=database_url, migrate=False) as store:
        outcome: list[Any] = []

        def checkout() -> None:
            try:
                with store.pool.connection():  # the pool's own timeout is 30 s
                    outcome.append("got one")
            except psycopg_pool.PoolTimeout:
                outcome.append("timed out")

        # The only connection is held throughout.
        with store.pool.connection(), bounded_waits(store.pool, 0.5):
            began = time.monotonic()
            waiter = threading.Thread(target=checkout)
            waiter.start()
            waiter.join(timeout=10)
            took = time.monotonic() - began
        assert outcome == ["timed out"]
        assert took < 5
        # Outside the block, the pool's timeout applies again: a free connection is taken as before.
        checkout()
        assert outcome == ["timed out", "got one"]


def test_past_the_deadline_a_free_connection_is_still_taken(database_url: str) -> None:
    settings = DatabaseSettings(pool_min_size=1, pool_max_size=1)
    with (
        open_store(settings, url=database_url, migrate=False) as store,
        bounded_waits(store.pool, 0.0),
        store.pool.connection() as conn,
    ):
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_shedding_idle_connections_keeps_the_last_one_while_the_pool_tries_to_grow(database_url: str) -> None:
    """A listener refused by a full server asks its process's pool for room (`shed_idle`). psycopg_pool
    counts the connections it is still trying to open with those it has, and against a full server those
    attempts fail for minutes: shedding down to that count closed the pool's last open connection, and a
    worker was left with none while the server's slots were held by connections nobody gave back. Here
    a role allowed one connection stands in for the full server."""
    role = f"lf_one_slot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
        try:
            pool = Pool(
                conninfo.make_conninfo(database_url, user=role),
                min_size=1,
                max_size=2,
                timeout=5.0,
                reconnect_timeout=60.0,
                kwargs={"autocommit": True},
                open=False,
            )
            pool.reclaim_idle = lambda: None  # as the store's pool has it
            pool.open(wait=True, timeout=10)
            try:
                held = pool.getconn()
                with pytest.raises(psycopg_pool.PoolTimeout):
                    pool.getconn(timeout=0.5)  # the pool starts growing: its attempts are refused
                assert pool.get_stats()["pool_size"] == 2  # the open connection and the attempt
                pool.putconn(held)

                assert pool.shed_idle() == 0
                assert pool.get_stats()["pool_available"] == 1
                with pool.connection(timeout=0.5) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
            finally:
                pool.close()
        finally:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
            )
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))

"""Migration 0016 gives the queue rows already there the version their run started with, from the log."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from eventstore import NewEvent, open_store
from eventstore import migrate as migrate_module
from eventstore.migrate import load_migrations, migrate


def test_queued_nodes_get_their_runs_version_from_the_log(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = load_migrations()
    monkeypatch.setattr(migrate_module, "load_migrations", lambda: [m for m in every if m.version < 16])
    migrate(fresh_database)
    started, unknown = uuid.uuid4(), uuid.uuid4()
    with open_store(url=fresh_database, migrate=False) as store:
        event = NewEvent("wf.RunStarted", {"run_id": str(started), "version": 3})
        store.append(f"wf-{started}", [event], tenant="acme")
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        for run_id, tenant in ((started, "acme"), (unknown, "default")):
            conn.execute(
                "INSERT INTO ledgerflow.workflow_queue (run_id, node, tenant, workflow, max_crashes)"
                " VALUES (%s, 'a', %s, 'w', 5)",
                (run_id, tenant),
            )
    monkeypatch.setattr(migrate_module, "load_migrations", lambda: every)
    assert 16 in [m.version for m in migrate(fresh_database)]
    with psycopg.connect(fresh_database) as conn:
        rows = dict(conn.execute("SELECT run_id, version FROM ledgerflow.workflow_queue").fetchall())
    assert rows == {started: "3", unknown: "1"}  # a version written as a number is its text

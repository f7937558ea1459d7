"""`ledgerflow log partitions|archive|restore`, the CLI's commands (run in this process)
against a real PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from eventstore import NewEvent, open_store
from tests.acceptance.cli_runs import invoke_cli as run


def _small_partitions(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE ledgerflow.events DETACH PARTITION ledgerflow.events_p000001")
        conn.execute("DROP TABLE ledgerflow.events_p000001")
        conn.execute("DELETE FROM ledgerflow.event_partitions")
        conn.execute("UPDATE ledgerflow.event_partitioning SET partition_size = 10")
        conn.execute("SELECT ledgerflow.events_ensure_partitions()")


def test_list_archive_and_restore(database_url: str, tmp_path: Path) -> None:
    _small_partitions(database_url)
    with open_store(url=database_url) as store:
        for i in range(25):
            store.append(f"order-{i % 3}", [NewEvent("Placed", {"i": i})])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledgerflow.projection_cursors (projection, cursor_tx, cursor_position, version)"
            " VALUES ('reports', 0, 0, 1)"
        )

    listed = run(database_url, "log", "partitions", "--json")
    assert listed.returncode == 0, listed.stderr
    parts = {p["name"]: p for p in json.loads(listed.stdout)}
    assert (parts["events_p000001"]["from_position"], parts["events_p000001"]["to_position"]) == (1, 11)
    assert {p["state"] for p in parts.values()} == {"attached"}
    table = run(database_url, "log", "partitions")
    assert "events_p000001" in table.stdout
    assert "1 .. 10" in table.stdout

    refused = run(database_url, "log", "archive", "events_p000001", "--to", str(tmp_path))
    assert refused.returncode == 1
    assert "reports" in refused.stderr
    assert "catch up" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "events_p000001.manifest.json").exists()

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE ledgerflow.projection_cursors SET cursor_tx = 9223372036854775807, cursor_position = 0"
        )
    archived = run(database_url, "log", "archive", "events_p000001", "--to", str(tmp_path))
    assert archived.returncode == 0, archived.stderr
    manifest = tmp_path / "events_p000001.manifest.json"
    assert json.loads(manifest.read_text())["events"] == 10
    after = {p["name"]: p for p in json.loads(run(database_url, "log", "partitions", "--json").stdout)}
    assert after["events_p000001"]["state"] == "archived"
    assert after["events_p000001"]["archived_to"] == str(manifest.resolve())

    restored = run(database_url, "log", "restore", str(manifest))
    assert restored.returncode == 0, restored.stderr
    assert "restored events_p000001" in restored.stdout
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM ledgerflow.events").fetchone() == (25,)

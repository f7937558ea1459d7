"""Migrations: applied once, in order, safely from several processes at once."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from eventstore.errors import MigrationError
from eventstore.migrate import load_migrations, migrate


def schema_objects(url: str) -> set[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relkind::text, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'ledgerflow' UNION ALL "
            "SELECT 'f', p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'ledgerflow'"
        ).fetchall()
    return {(str(k), str(n)) for k, n in rows}


def test_migrate_creates_the_schema_and_reapplying_is_a_no_op(fresh_database: str) -> None:
    applied = migrate(fresh_database)
    assert [m.version for m in applied] == [m.version for m in load_migrations()]
    objects = schema_objects(fresh_database)
    assert {
        ("p", "events"),  # partitioned by position range (0020)
        ("r", "streams"),
        ("r", "idempotency_keys"),
        ("r", "schema_migrations"),
        ("f", "append_events"),
        ("r", "subject_keys"),  # the subjects' data keys (0054)
    } <= objects
    assert migrate(fresh_database) == []
    assert schema_objects(fresh_database) == objects


def test_processes_migrating_at_the_same_moment_all_succeed(fresh_database: str) -> None:
    script = "import sys; from eventstore.migrate import migrate; print(len(migrate(sys.argv[1])))"
    procs = [
        subprocess.Popen([sys.executable, "-c", script, fresh_database], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    counts = [int(p.communicate(timeout=60)[0].split()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    # Each migration was applied by exactly one process; the others found it done.
    assert sum(counts) == len(load_migrations())
    with psycopg.connect(fresh_database) as conn:
        row = conn.execute("SELECT count(*) FROM ledgerflow.schema_migrations").fetchone()
    assert row == (len(load_migrations()),)


def test_an_edited_migration_is_refused(fresh_database: str) -> None:
    migrate(fresh_database)
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute("UPDATE ledgerflow.schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match="forward-only"):
        migrate(fresh_database)


def test_pending_migrations_read_the_files_once_per_process(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes (readyz, doctor) ask for pending migrations at every check: the files are read once."""
    from eventstore import migrate as migrate_module

    migrate(fresh_database)
    shipped = migrate_module.shipped_migrations()
    assert [m.version for m in shipped] == [m.version for m in load_migrations()]

    def no_reading() -> list[migrate_module.Migration]:
        raise AssertionError("the migration files were read again")

    monkeypatch.setattr(migrate_module, "load_migrations", no_reading)
    with psycopg.connect(fresh_database) as conn:
        for _ in range(3):
            assert migrate_module.pending_migrations(conn) == []

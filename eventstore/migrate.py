"""Apply the numbered SQL files of `migrations/` exactly once, in order, from any number of processes.

Each file runs in its own transaction that first takes a transaction-scoped advisory lock, so processes
starting at the same moment queue and the later ones find the work done. Transaction-scoped locks are
released by COMMIT, which keeps them correct behind transaction-pooling connection poolers.
A file's checksum is recorded: editing an applied migration is refused rather than silently ignored.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import structlog

from eventstore.db import wrap_exceptions
from eventstore.errors import MigrationError
from eventstore.rows import fetch_value

log = structlog.get_logger(__name__)

# An arbitrary constant naming "the ledgerflow migration lock" among advisory locks.
_MIGRATION_LOCK_ID = 0x4C65_6467_6572  # "Ledger"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _migrations_dir() -> Path:
    # Installed from a wheel, the files ship inside the package; from a source checkout they are read
    # from the top-level migrations/ folder.
    packaged = resources.files("eventstore") / "_migrations"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "migrations"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    found: list[Migration] = []
    folder = directory or _migrations_dir()
    for path in sorted(folder.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path}: migration files are named NNNN_short_description.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a number in {folder}")
    return found


def _ensure_bookkeeping(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE SCHEMA IF NOT EXISTS ledgerflow")
    conn.execute(
        """CREATE TABLE IF NOT EXISTS ledgerflow.schema_migrations (
                version     integer PRIMARY KEY,
                name        text        NOT NULL,
                checksum    text        NOT NULL,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )"""
    )


def applied_versions(conn: psycopg.Connection[Any]) -> dict[int, str]:
    """Version -> checksum of every applied migration (empty on a fresh database)."""
    if not fetch_value(conn, "SELECT to_regclass('ledgerflow.schema_migrations') IS NOT NULL"):
        return {}
    rows = conn.execute("SELECT version, checksum FROM ledgerflow.schema_migrations").fetchall()
    return {int(v): str(c) for v, c in rows}


@functools.cache
def shipped_migrations() -> tuple[Migration, ...]:
    """The migrations this installation ships, read from their files once per process: they do not change
    while it runs, and probes (`/api/readyz`, doctor) ask for them on every check."""
    return tuple(load_migrations())


def pending_migrations(conn: psycopg.Connection[Any]) -> list[Migration]:
    done = applied_versions(conn)
    return [m for m in shipped_migrations() if m.version not in done]


def migrate(url: str) -> list[Migration]:
    """Apply every pending migration; return the ones this call applied (empty when up to date). Often
    the first connection a process makes: one refused or failed comes out typed (DatabaseRefusedError,
    DatabaseUnavailableError)."""
    applied: list[Migration] = []
    migrations = load_migrations()
    with (
        wrap_exceptions(),
        psycopg.connect(url, autocommit=True, application_name="ledgerflow-migrate") as conn,
    ):
        # Every role and CLI call migrates at start-up, and almost always finds nothing to do: one read
        # says so, where the locked walk below costs six round trips per file. A pending or changed file
        # takes the walk, which applies it under the lock or names the change.
        done = applied_versions(conn)
        if all(done.get(m.version) == m.checksum for m in migrations):
            return applied
        for migration in migrations:
            with conn.transaction():
                # Serialises concurrent migrators; CREATE SCHEMA IF NOT EXISTS is not race-free alone.
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
                _ensure_bookkeeping(conn)
                checksum = fetch_value(
                    conn,
                    "SELECT checksum FROM ledgerflow.schema_migrations WHERE version = %s",
                    (migration.version,),
                )
                if checksum is not None:
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was changed after it was "
                            "applied; migrations are forward-only: add a new numbered file instead"
                        )
                    continue
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO ledgerflow.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
            log.info("migration_applied", version=migration.version, name=migration.name)
            applied.append(migration)
    return applied

"""migrations/schema/ledgerflow.sql is the schema the migrations add up to: a migration that changes the
schema without the file being generated again (`python -m tests.schema_dump`) fails here."""

from __future__ import annotations

import difflib

import pytest

from eventstore import apply_migrations
from tests.schema_dump import SCHEMA_FILE, dump, pg_dump_for, server_major


def test_the_schema_file_is_what_the_migrations_add_up_to(fresh_database: str) -> None:
    apply_migrations(fresh_database)
    major = server_major(fresh_database)
    recorded = SCHEMA_FILE.read_text(encoding="utf-8")
    if f"printed by pg_dump {major}." not in recorded.splitlines()[0]:
        pytest.skip(f"the file was printed by another PostgreSQL than this server's {major}")
    if pg_dump_for(major) is None:
        pytest.skip(f"no pg_dump for PostgreSQL {major} (apt-get install postgresql-client-{major})")
    live = dump(fresh_database)
    diff = "".join(
        difflib.unified_diff(
            recorded.splitlines(keepends=True), live.splitlines(keepends=True), "recorded", "migrated", n=1
        )
    )
    assert not diff, f"run `python -m tests.schema_dump` and commit the file:\n{diff[:4000]}"

"""A projection's tables in PostgreSQL: creating them, their shadow copies, and the atomic swap.

Live tables sit in the projection's schema under their own names, so readers query plain tables.
A rebuild fills a shadow schema (`lf_shadow_<projection>_<run>`) and the swap moves, in one transaction,
the live tables into `lf_retired_<projection>` (kept for rollback until the next rebuild) and the shadow
tables into the live schema. Readers see the old complete tables until the swap commits, then the new.
A verify builds in `lf_verify_<projection>_<run>`. Scratch schemas are named by their run, so two runs
never share one, and a schema whose run is no longer running is an orphan any worker may drop.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from eventstore.spi import fetch_value
from projector.projection import Projection


def shadow_schema(projection: Projection, run_id: int) -> str:
    return f"lf_shadow_{projection.name}_{run_id}"


def retired_schema(projection: Projection) -> str:
    return f"lf_retired_{projection.name}"


def verify_schema(projection: Projection, run_id: int) -> str:
    return f"lf_verify_{projection.name}_{run_id}"


def run_of_scratch_schema(schema: str) -> int | None:
    """The run id a scratch schema belongs to (None if `schema` is not one)."""
    prefix, _, run = schema.rpartition("_")
    if not prefix.startswith(("lf_shadow_", "lf_verify_")) or not run.isdigit():
        return None
    return int(run)


def missing_tables(conn: psycopg.Connection[Any], projection: Projection, schema: str) -> list[str]:
    missing = []
    for name in projection.table_names:
        found = fetch_value(conn, "SELECT to_regclass(%s)", (sql.Identifier(schema, name).as_string(conn),))
        if found is None:
            missing.append(name)
    return missing


def ensure_live_tables(conn: psycopg.Connection[Any], projection: Projection) -> None:
    """Create the live schema and any missing table (inside the caller's transaction)."""
    # CREATE ... IF NOT EXISTS is not safe against a concurrent creator; this lock makes it so.
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('ledgerflow.projection.' || %s))", (projection.name,))
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(projection.schema)))
    missing = set(missing_tables(conn, projection, projection.schema))
    for table in projection.tables:
        if table.name in missing:
            for statement in _create(projection, table.name, projection.schema):
                conn.execute(statement)


def recreate_schema(conn: psycopg.Connection[Any], projection: Projection, schema: str) -> None:
    """Drop `schema` with everything in it and create the projection's empty tables there."""
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for table in projection.tables:
        for statement in _create(projection, table.name, schema):
            conn.execute(statement)


def drop_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def lock_live_tables(conn: psycopg.Connection[Any], projection: Projection, timeout_ms: int) -> None:
    """Take every live table's ACCESS EXCLUSIVE lock up front, giving up after `timeout_ms`.

    A reader that reads two of the tables could otherwise hold one while the swap holds the other: a
    deadlock that PostgreSQL would break by killing the reader's query. With a lock timeout shorter
    than the deadlock timeout, the swap yields instead (LockNotAvailable) and the caller retries it.
    """
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{timeout_ms}ms",))
    existing = [
        n for n in projection.table_names if n not in missing_tables(conn, projection, projection.schema)
    ]
    if existing:
        names = sql.SQL(", ").join(sql.Identifier(projection.schema, n) for n in existing)
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(names))
    conn.execute("SELECT set_config('lock_timeout', '0', true)")


def swap_in_shadow(conn: psycopg.Connection[Any], projection: Projection, shadow: str) -> None:
    """Inside the caller's transaction: retire the live tables and move the shadow ones in their place."""
    live, retired = projection.schema, retired_schema(projection)
    drop_schema(conn, retired)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(retired)))
    for name in projection.table_names:
        conn.execute(
            sql.SQL("ALTER TABLE IF EXISTS {} SET SCHEMA {}").format(
                sql.Identifier(live, name), sql.Identifier(retired)
            )
        )
        conn.execute(
            sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(sql.Identifier(shadow, name), sql.Identifier(live))
        )
    drop_schema(conn, shadow)


def replace_tenant_rows(
    conn: psycopg.Connection[Any], projection: Projection, scratch: str, tenant: str
) -> None:
    """Inside the caller's transaction: replace one tenant's rows of every live table by the scratch
    copy's (a per-tenant projection's scratch copy holds only that tenant's rows)."""
    for name in projection.table_names:
        live, copy = sql.Identifier(projection.schema, name), sql.Identifier(scratch, name)
        conn.execute(sql.SQL("DELETE FROM {} WHERE tenant = %s").format(live), (tenant,))
        conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(live, copy))


def _create(projection: Projection, table: str, schema: str) -> list[sql.Composed]:
    spec = next(t for t in projection.tables if t.name == table)
    return [
        sql.SQL(part).format(table=sql.Identifier(schema, table))
        for part in spec.ddl.split(";")
        if part.strip()
    ]

"""A deterministic digest of a projection's tables, and the rows by which two copies differ.

Each table contributes its row count and the sum of a 64-bit hash of every row's text form: independent
of physical row order, cheap to compute in one scan. Tables whose rows hold values that differ between
builds (serial ids, now()) cannot match between a rebuild and the live copy; projections avoid them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from projector.projection import Projection

# `%(tenant)s` NULL: every row; else only that tenant's rows (of a per-tenant projection).
_TABLE_DIGEST = sql.SQL(
    "SELECT count(*), coalesce(sum(hashtextextended(t::text, 0)::numeric), 0) FROM {} t {}"
)
_ONLY_IN = sql.SQL(
    "SELECT t::text FROM {} t {} EXCEPT ALL SELECT t::text FROM {} t {} ORDER BY 1 LIMIT %(limit)s"
)


def _rows_of(tenant: str | None) -> sql.Composable:
    return sql.SQL("") if tenant is None else sql.SQL("WHERE t.tenant = %(tenant)s")


def projection_digest(
    conn: psycopg.Connection[Any], projection: Projection, schema: str, *, tenant: str | None = None
) -> str:
    """The digest of the projection's tables in `schema` (with `tenant`: of that tenant's rows only)."""
    parts: list[str] = []
    for name in sorted(projection.table_names):
        query = _TABLE_DIGEST.format(sql.Identifier(schema, name), _rows_of(tenant))
        row = conn.execute(query, {"tenant": tenant}).fetchone()
        assert row is not None
        parts.append(f"{name}:{row[0]}:{row[1]}")
    return hashlib.sha256(";".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class TableDifference:
    table: str
    only_in_live: list[str]
    only_in_rebuilt: list[str]


def differing_rows(
    conn: psycopg.Connection[Any],
    projection: Projection,
    live: str,
    rebuilt: str,
    limit: int = 20,
    *,
    tenant: str | None = None,
) -> list[TableDifference]:
    """Rows (as text) that one copy has and the other lacks, per table, at most `limit` each way."""
    found: list[TableDifference] = []
    rows = _rows_of(tenant)
    params = {"tenant": tenant, "limit": limit}
    for name in sorted(projection.table_names):
        a, b = sql.Identifier(live, name), sql.Identifier(rebuilt, name)
        only_live = [r[0] for r in conn.execute(_ONLY_IN.format(a, rows, b, rows), params).fetchall()]
        only_rebuilt = [r[0] for r in conn.execute(_ONLY_IN.format(b, rows, a, rows), params).fetchall()]
        if only_live or only_rebuilt:
            found.append(TableDifference(name, only_live, only_rebuilt))
    return found

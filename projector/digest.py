"""A deterministic digest of a projection's tables, and the rows by which two copies differ.

Each table contributes its row count and the sum of a 64-bit hash of every row's text form: independent
of physical row order, cheap to compute in one scan. Tables whose rows hold values that differ between
builds (serial ids, now()) cannot match between a rebuild and the live copy; projections avoid them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from eventstore.spi import fetch_one, fetch_values
from projector.projection import Projection

# `%(tenant)s` NULL: every row; else only that tenant's rows (of a per-tenant projection).
_TABLE_DIGEST = sql.SQL(
    "SELECT count(*) AS rows, coalesce(sum(hashtextextended(t::text, 0)::numeric), 0) AS hash_sum"
    " FROM {} t {}"
)
_ONLY_IN = sql.SQL(
    "SELECT t::text FROM {} t {} EXCEPT ALL SELECT t::text FROM {} t {} ORDER BY 1 LIMIT %(limit)s"
)


@dataclass(frozen=True, slots=True)
class _TableSum:
    """A row of _TABLE_DIGEST: the table's row count and the sum of its rows' hashes."""

    rows: int
    hash_sum: Decimal


def _rows_of(tenant: str | None) -> sql.Composable:
    return sql.SQL("") if tenant is None else sql.SQL("WHERE t.tenant = %(tenant)s")


def projection_digest(
    conn: psycopg.Connection[Any], projection: Projection, schema: str, *, tenant: str | None = None
) -> str:
    """The digest of the projection's tables in `schema` (with `tenant`: of that tenant's rows only)."""
    parts: list[str] = []
    for name in sorted(projection.table_names):
        query = _TABLE_DIGEST.format(sql.Identifier(schema, name), _rows_of(tenant))
        table = fetch_one(conn, _TableSum, query, {"tenant": tenant})
        assert table is not None  # an aggregate answers one row
        parts.append(f"{name}:{table.rows}:{table.hash_sum}")
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
        only_live = fetch_values(conn, _ONLY_IN.format(a, rows, b, rows), params)
        only_rebuilt = fetch_values(conn, _ONLY_IN.format(b, rows, a, rows), params)
        if only_live or only_rebuilt:
            found.append(TableDifference(name, only_live, only_rebuilt))
    return found

"""Shared helpers for the hand-run benchmarks in bench/: throwaway databases, the raw-psycopg twin of
the events table, payloads, and result tables.

Benchmarks here never report one absolute time alone: every number is set against a baseline measured
in the same run on the same machine, because absolute times on a shared 2-core box drift by more than
the differences we care about.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import statistics
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg import sql

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def default_admin_url() -> str:
    """The server to benchmark against: LEDGERFLOW_BENCH_URL, else the local development server."""
    return os.environ.get("LEDGERFLOW_BENCH_URL", DEFAULT_ADMIN_URL)


def quiet_logs() -> None:
    """Silence info-level logs (migrations, imports) so that they do not interleave with the results.

    Logging is also work inside the measured calls; ledgerflow logs one line per import, which is
    negligible next to 100k rows, so filtering it changes nothing measurable.
    """
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("eventsourcing").setLevel(logging.WARNING)


def with_database(url: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


@contextmanager
def fresh_database(admin_url: str, prefix: str = "bench") -> Iterator[str]:
    """A new, empty database for one run, dropped afterwards even if the run fails.

    A fresh database per run means every run starts from empty tables and indexes, so runs are
    comparable and no run pays for the bloat of the previous one.
    """
    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(admin_url, name)
    finally:
        # FORCE: a connection leaked by a failed run must not leave the database behind.
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# -- the raw twin of ledgerflow.events -----------------------------------------------------------------

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity::text,
       a.attgenerated::text, coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attcollation::int
  FROM pg_attribute a
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = %(t)s::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""
# Constraint and index names differ between the two tables (LIKE generates its own); their
# definitions are what must match.
_CONSTRAINTS = """
SELECT contype::text, pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = %(t)s::regclass ORDER BY 1, 2
"""
_INDEXES = """
SELECT i.indisprimary, i.indisunique, substring(pg_get_indexdef(i.indexrelid) from ' USING .*$')
  FROM pg_index i WHERE i.indrelid = %(t)s::regclass ORDER BY 3
"""
_IDENTITY = """
SELECT s.seqtypid::regtype::text, s.seqstart, s.seqincrement, s.seqcache, s.seqcycle
  FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence(%(t)s, 'position')::regclass
"""
_STORAGE = """
SELECT coalesce(reloptions, '{}')::text, relpersistence::text FROM pg_class WHERE oid = %(t)s::regclass
"""
_INSERT_TRIGGERS = """
SELECT count(*) FROM pg_trigger
 WHERE tgrelid = %(t)s::regclass AND NOT tgisinternal AND (tgtype::int & 4) <> 0
"""


def table_shape(conn: psycopg.Connection[Any], table: str) -> dict[str, list[tuple[Any, ...]]]:
    """What decides a table's insert cost: columns with defaults/identity/generation, constraints,
    indexes, the identity sequence, storage options and INSERT triggers."""
    queries = {
        "columns": _COLUMNS,
        "constraints": _CONSTRAINTS,
        "indexes": _INDEXES,
        "identity sequence": _IDENTITY,
        "storage": _STORAGE,
        "insert triggers": _INSERT_TRIGGERS,
    }
    return {what: conn.execute(q, {"t": table}).fetchall() for what, q in queries.items()}


def create_twin_table(url: str, source: str, schema: str, table: str = "events") -> list[str]:
    """Create `schema.table` with the same columns, constraints, indexes and defaults as `source`;
    return the differences found afterwards (empty when the twin is exact).

    LIKE ... INCLUDING ALL copies identity, generated columns, defaults, CHECK constraints, indexes
    (primary key and unique constraints included), statistics, storage and compression, but not
    triggers. A partitioned source (ledgerflow.events, partitioned by position) gets a partitioned twin
    with a twin of each of its partitions (same bounds, same per-partition indexes), and its INSERT
    trigger (the one that keeps event ids unique per tenant) on the twin too: the same work.
    `table_shape` checks that both have as many INSERT triggers.
    """
    target = f"{schema}.{table}"
    twin = sql.Identifier(schema, table)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        partitioned = conn.execute(
            "SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", (source,)
        ).fetchone() == (True,)
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL){}").format(
                twin,
                sql.Identifier(*source.split(".")),
                sql.SQL(" PARTITION BY RANGE (position)") if partitioned else sql.SQL(""),
            )
        )
        if partitioned:
            parts = conn.execute(
                "SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
                (source,),
            ).fetchall()
            for n, (part, bound) in enumerate(parts):
                twin_part = sql.Identifier(schema, f"{table}_p{n}")
                conn.execute(
                    sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                        twin_part, sql.Identifier(*part.split("."))
                    )
                )
                conn.execute(
                    sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(
                        twin,
                        twin_part,
                        sql.SQL(bound),  # type: ignore[arg-type]  # from the catalogue
                    )
                )
            # Its INSERT triggers (the event-id claim: a statement trigger since migrations/0040), as the
            # catalogue defines them, on the twin: the same work per statement and per row.
            triggers = conn.execute(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
                " WHERE tgrelid = %s::regclass AND NOT tgisinternal AND (tgtype::int & 4) <> 0",
                (source,),
            ).fetchall()
            on_source = " ON " + source + " "
            for (definition,) in triggers:
                if on_source not in definition:
                    raise SystemExit(f"cannot copy the trigger {definition!r} to {target}")
                conn.execute(definition.replace(on_source, f" ON {target} ", 1))  # from the catalogue
        want, got = table_shape(conn, source), table_shape(conn, target)
    return [
        f"{what}: {source} has {want[what]}, {target} has {got[what]}"
        for what in want
        if want[what] != got[what]
    ]


def create_plain_table(url: str, source: str, ids: str, schema: str, table: str = "events") -> list[str]:
    """Create `schema.table`: what a user would write instead of a partitioned `source`. The same columns,
    defaults, identity, generated column and checks, and the same indexes, each on the one table: the
    parent's, a partition's (the unique stream version), and the unique (tenant, event_id) that the
    partitioned log keeps in the separate table `ids`. No partitions, no triggers. Return the differences
    from that description found afterwards (empty when the table is what it says)."""
    target = f"{schema}.{table}"
    plain = sql.Identifier(schema, table)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                plain, sql.Identifier(*source.split("."))
            )
        )
        row = conn.execute(
            "SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = %s::regclass"
            " ORDER BY 1 LIMIT 1",
            (source,),
        ).fetchone()
        if row is None:
            raise SystemExit(f"{source} has no partition to copy the indexes of")
        (partition,) = row
        want = table_shape(conn, source)
        # Every unique index of a partition and of the id table that the parent does not already have.
        extra = [
            index
            for relation in (partition, ids)
            for index in conn.execute(_INDEXES, {"t": relation}).fetchall()
            if index not in want["indexes"]
        ]
        for _, unique, using in extra:
            columns = using[using.index("(") :]
            conn.execute(
                sql.SQL("CREATE {}INDEX ON {} {}").format(
                    sql.SQL("UNIQUE " if unique else ""),
                    plain,
                    sql.SQL(columns),  # type: ignore[arg-type]  # from the catalogue
                )
            )
        want["indexes"] = sorted(
            [*want["indexes"], *((False, u, x) for _, u, x in extra)], key=lambda i: i[2]
        )
        want["insert triggers"] = [(0,)]
        got = table_shape(conn, target)
    return [
        f"{what}: {target} should have {want[what]}, has {got[what]}"
        for what in want
        if want[what] != got[what]
    ]


# -- payloads ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Payload:
    """One event's content as an application holds it before appending: a type and two dicts."""

    type: str
    data: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)


def dump_json(value: Mapping[str, Any]) -> str:
    """The serialisation every system in a benchmark uses: the same call ledgerflow makes, so the bytes
    sent (and the client CPU spent making them) are identical."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def make_payloads(count: int, seed: int) -> list[Payload]:
    """`count` distinct payloads of about 150 bytes of data and 50 bytes of metadata each.

    Built outside the timed sections: every system receives the same dicts, as an application would
    hand them over.
    """
    rng = random.Random(seed)
    types = ("OrderPlaced", "OrderPaid", "ItemAdded", "ItemRemoved", "OrderShipped")
    out: list[Payload] = []
    for i in range(count):
        data = {
            "order_id": f"ord-{i:08d}",
            "customer_id": str(uuid.UUID(int=rng.getrandbits(128))),
            "amount_cents": rng.randrange(100, 1_000_000),
            "currency": rng.choice(("EUR", "USD", "GBP")),
            "items": [{"sku": f"SKU-{rng.randrange(10_000):05d}", "qty": rng.randrange(1, 5)}],
        }
        metadata = {"source": "bench", "user": f"user-{rng.randrange(1000)}", "v": 1}
        out.append(Payload(types[i % len(types)], data, metadata))
    return out


# -- CPU accounting ---------------------------------------------------------------------------------


class ServerCpu:
    """CPU seconds used so far by the server processes serving one database, read from /proc.

    Wall-clock ratios on a shared 2-core machine swing with whatever else runs; CPU spent per event
    (client process + its server backends) barely does, and it is what bounds throughput when client
    and server share the cores. Works only when PostgreSQL runs on this machine and its processes are
    visible in /proc; otherwise `available` is False and only wall-clock results are reported.
    """

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True, application_name="bench-cpu-probe")
        self._dbname = self._conn.info.dbname
        self._tick = os.sysconf("SC_CLK_TCK")
        self.available = self.seconds() is not None

    def seconds(self) -> float | None:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (self._dbname,)
        ).fetchall()
        ticks = 0
        for (pid,) in rows:
            try:
                with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                    # Fields after the ")" that closes the command name: utime and stime are 12th and 13th.
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return None
            ticks += int(fields[11]) + int(fields[12])
        return ticks / self._tick

    def close(self) -> None:
        self._conn.close()


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds used so far by process `pid` (all its threads), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            # Fields after the ")" that closes the command name: utime and stime are 12th and 13th.
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """CPU seconds all processes of this machine spent busy so far (every state of /proc/stat but idle
    and iowait), summed over CPUs."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already counted in user).
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def process_shape(pid: int) -> tuple[int, int]:
    """(threads, child processes) of process `pid` right now, from /proc; (0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration):
        return 0, 0
    children = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                # The parent's pid is the 2nd field after the ")" that closes the command name.
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children += 1
        except OSError:
            continue
    return threads, children


#: PostgreSQL's shortest interval between two publications of a backend's statistics (PGSTAT_MIN_INTERVAL),
#: with a margin.
STATS_SETTLE = 1.2


class BackendCpu:
    """CPU seconds of the server processes serving one database over a window, per backend.

    Unlike `ServerCpu`, a backend that connects during the window counts from zero, not with whatever
    it had used before, so pools that open connections late are accounted for. A backend that ends
    during the window loses its share (pools in a benchmark keep theirs open to the end). This probe's
    own backend is left out.
    """

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True, application_name="bench-cpu-probe")
        self._dbname = self._conn.info.dbname

    def snapshot(self) -> dict[int, float]:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (self._dbname,)
        ).fetchall()
        found = {pid: process_cpu_seconds(pid) for (pid,) in rows}
        return {pid: cpu for pid, cpu in found.items() if cpu is not None}

    def transactions(self) -> int:
        """Transactions committed or rolled back in this database so far, by every backend.

        Backends publish these counts at most once a second, and within a second of going idle: reading
        them STATS_SETTLE seconds after the work stopped counts all of it (and that second's idle work).
        """
        time.sleep(STATS_SETTLE)
        row = self._conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (self._dbname,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def used(before: Mapping[int, float], after: Mapping[int, float]) -> float:
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())

    def close(self) -> None:
        self._conn.close()


def load_average() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} CPUs"


# -- statistics and printing --------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(values: Sequence[float]) -> str:
    """Median of per-run ratios, with the range so the reader can see the noise."""
    if not values:
        return "-"
    return f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))

"""Migration 0020 turns an existing, filled events table into the partitioned log, losing nothing."""

from __future__ import annotations

import psycopg
import pytest

from eventstore import NO_STREAM, EventStore, NewEvent, open_store
from eventstore.errors import DuplicateEventIdError
from eventstore.migrate import load_migrations, migrate
from tests.waiting import wait_until

_PARTITIONED = 20


def _migrate_before_partitioning(url: str) -> None:
    """Apply every migration before 0020, recorded as `migrate` records them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS ledgerflow")
        conn.execute(
            "CREATE TABLE ledgerflow.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for m in load_migrations():
            if m.version >= _PARTITIONED:
                continue
            with conn.transaction():
                conn.execute(m.sql.encode())
                conn.execute(
                    "INSERT INTO ledgerflow.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (m.version, m.name, m.checksum),
                )


def _log(conn: psycopg.Connection[object]) -> list[tuple[object, ...]]:
    return conn.execute(
        "SELECT position, transaction_id::text, tenant, stream_id, category, stream_version, event_id,"
        " event_type, data, metadata, correlation_id, causation_id, recorded_at"
        " FROM ledgerflow.events ORDER BY position"
    ).fetchall()


def test_an_existing_log_is_partitioned_with_every_event_kept(fresh_database: str) -> None:
    _migrate_before_partitioning(fresh_database)
    with open_store(url=fresh_database, migrate=False) as old:
        for i in range(30):
            old.append(f"order-{i % 4}", [NewEvent("OrderPlaced", {"i": i}, metadata={"n": i})])
        old.append("order-x", [NewEvent("Paid", {})], idempotency_key="pay-x", tenant="acme")
        reused = old.read_stream("order-1")[0].event_id
    with psycopg.connect(fresh_database) as conn:
        before = _log(conn)
        conn.execute("SELECT pg_current_xact_id()")  # a rolled-back position leaves a gap, as in life
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(
                "INSERT INTO ledgerflow.events (tenant, stream_id, stream_version, event_id, event_type,"
                " data) VALUES ('default', 'order-0', 1, gen_random_uuid(), 'T', '{}')"
            )
    # 0020 converts the log; later migrations follow it.
    applied = [m.version for m in migrate(fresh_database)]
    assert applied[:1] == [_PARTITIONED]

    with psycopg.connect(fresh_database) as conn:
        assert _log(conn) == before
        kind = conn.execute("SELECT relkind::text FROM pg_class WHERE oid = 'ledgerflow.events'::regclass")
        assert kind.fetchone() == ("p",)
    store: EventStore
    with open_store(url=fresh_database) as store:
        # Appends continue after the last position, versions after each stream's last.
        result = store.append("order-1", [NewEvent("OrderPaid", {})], expected_version=8)
        assert result.events[0].position > max(int(str(r[0])) for r in before)
        assert result.events[0].stream_version == 9
        # A retry with the key recorded before the migration still gets the first answer.
        again = store.append("order-x", [NewEvent("Paid", {})], idempotency_key="pay-x", tenant="acme")
        assert again.duplicate
        # An event id used before the migration is still taken.
        with pytest.raises(DuplicateEventIdError):
            store.append("order-9", [NewEvent("Placed", {}, event_id=reused)], expected_version=NO_STREAM)
        # Gap-free reading waits for every older transaction on the server to end.
        page = wait_until(lambda: (p := store.read_all(limit=100)).caught_up and len(p.events) == 32 and p)
        assert [e.position for e in page.events] == sorted(e.position for e in page.events)
        assert store.read_stream("order-1")[-1].type == "OrderPaid"


def test_a_new_log_starts_with_a_partition_ahead(fresh_database: str) -> None:
    migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        parts = conn.execute(
            "SELECT from_position, to_position, state FROM ledgerflow.event_partitions"
        ).fetchall()
    assert parts == [(1, 1_000_001, "attached")]

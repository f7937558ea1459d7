"""An empty log whose partitions are a few positions wide, so that a few dozen events cross several."""

from __future__ import annotations

import psycopg


def narrow_partitions(database_url: str, size: int, *, headroom: int | None = None) -> None:
    """Replace the empty log's first partition with partitions `size` positions wide, made ahead by
    `headroom` positions (default: one partition, as the store keeps)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE ledgerflow.events DETACH PARTITION ledgerflow.events_p000001")
        conn.execute("DROP TABLE ledgerflow.events_p000001")
        conn.execute("DELETE FROM ledgerflow.event_partitions")
        conn.execute("UPDATE ledgerflow.event_partitioning SET partition_size = %s", (size,))
        conn.execute("SELECT ledgerflow.events_ensure_partitions(%s)", (headroom,))

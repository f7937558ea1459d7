"""What the queue holds, for operators' views: its rows counted by state, and the recent recovery passes.
Reads only, apart from the statements that change the queue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from eventstore.spi import fetch_all, fetch_one
from workflows.queries import Q

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Recovery:
    id: int
    worker: str
    trigger: str
    started_at: datetime
    duration_ms: float
    found: int
    reclaimed: int
    parked: int
    stuck: int
    failed: int


def recent_recoveries(conn: Conn, limit: int = 20) -> list[Recovery]:
    return fetch_all(conn, Recovery, Q["recent_recoveries"], {"limit": limit})


@dataclass(frozen=True)
class QueueSummary:
    ready: int
    running: int
    orphaned: int
    parked: int


def summary(conn: Conn) -> QueueSummary:
    found = fetch_one(conn, QueueSummary, Q["queue_summary"])
    assert found is not None  # an aggregate answers one row
    return found

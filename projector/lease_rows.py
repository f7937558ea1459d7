"""The projector's lease rows: which worker holds each projection (or segment) and until when.

Each function takes the caller's connection, so callers combine them in one transaction where a guarantee
needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from eventstore.spi import fetch_all, fetch_one, fetch_value, load_queries

Q = load_queries("projector")
Conn = psycopg.Connection[Any]


def acquire_lease(conn: Conn, projection: str, owner: str, ttl: float) -> int | None:
    epoch: int | None = fetch_value(
        conn, Q["acquire_lease"], {"projection": projection, "owner": owner, "ttl": ttl}
    )
    return epoch


def renew_lease(conn: Conn, projection: str, owner: str, epoch: int, ttl: float) -> bool:
    params = {"projection": projection, "owner": owner, "epoch": epoch, "ttl": ttl}
    return bool(fetch_value(conn, Q["renew_lease"], params))


def release_lease(conn: Conn, projection: str, owner: str, epoch: int) -> None:
    conn.execute(Q["release_lease"], {"projection": projection, "owner": owner, "epoch": epoch})


def hold_lease(conn: Conn, projection: str, owner: str, epoch: int, ttl: float) -> bool:
    params = {
        "projection": projection,
        "owner": owner,
        "epoch": epoch,
        "idle_ms": str(max(1, int(ttl * 1000))),
    }
    return conn.execute(Q["hold_lease"], params).fetchone() is not None


@dataclass(frozen=True)
class LeaseInfo:
    owner: str
    epoch: int
    alive: bool
    heartbeat_at: datetime
    expires_at: datetime


def lease_of(conn: Conn, projection: str) -> LeaseInfo | None:
    return fetch_one(conn, LeaseInfo, Q["lease_of"], {"projection": projection})


@dataclass(frozen=True)
class SegmentLease:
    segment: int
    owner: str
    alive: bool
    #: Seconds since it lapsed (negative while alive).
    lapsed_for: float


def segment_leases(conn: Conn, projection: str) -> dict[int, SegmentLease]:
    leases = fetch_all(conn, SegmentLease, Q["segment_leases"], {"projection": projection})
    return {lease.segment: lease for lease in leases}


def live_workers(conn: Conn, application_name: str) -> int:
    return int(fetch_value(conn, Q["live_workers"], {"application_name": application_name}) or 0)

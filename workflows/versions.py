"""Which versions of which workflows the live worker processes have, and which runs wait for a version
that none of them has.

A run goes on only with the version of its definition it started with: a worker claims nothing of runs
started with a version it lacks (the claim filters on the queue row's version, migration 0016). Such a run
simply waits. To make the wait visible, each worker process records the (workflow, version) pairs it has
when it starts, and `ledgerflow doctor` and the run view name the runs no live worker can go on with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from eventstore.spi import load_queries
from workflows.queue_claims import WorkflowVersion

Q = load_queries("workflows", "versions.sql")
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class VersionWait:
    """Ready nodes of runs started with a version that no live worker has."""

    workflow: str
    version: str
    runs: int
    nodes: int
    waiting_since: datetime


def advertise(conn: Conn, instance: str, workflows: Sequence[WorkflowVersion]) -> None:
    """Record that process `instance` has `workflows`, and forget the pairs of processes that are gone."""
    with conn.transaction():
        conn.execute(Q["forget_departed_versions"], {"instance": instance})
        conn.execute(
            Q["advertise_versions"],
            {
                "instance": instance,
                "workflows": [name for name, _ in workflows],
                "versions": [version for _, version in workflows],
            },
        )


def versions_without_worker(conn: Conn) -> list[VersionWait]:
    with conn.cursor(row_factory=class_row(VersionWait)) as cur:
        return cur.execute(Q["versions_without_worker"]).fetchall()

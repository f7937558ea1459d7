"""Waiting for a run's end without holding a connection: a `projector.Watch` on the run table.

A server waits for many runs at once on its one shared listener (`projector.ProjectionWaiters`): every
batch of `workflow_tables` notifies, and one query (`ended_runs`) answers every waited run whose row shows
an ended status. The row trails the run's stream by the projector's lag, so a waiter reads the run's stream
once woken (`Engine.load`, exact) and answers from that.

One case needs the key's third part: a run retried or refreshed after its end is active again in its
stream while its row still shows the old end, until the projector applies the retry. A waiter woken by
that stale row waits again for a row changed since (`updated_at` later than the stale row's: every row's
times come from its run's events), rather than being woken at once by the same row, over and over.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from eventstore import MissingRelationError
from eventstore.spi import load_queries
from projector import Watch
from workflows.errors import wrap_exceptions
from workflows.projections import workflow_tables
from workflows.run_state import TERMINAL_RUN

Q = load_queries("workflows", "run_ends.sql")


class RunEnd(NamedTuple):
    """What a waiter waits for: run `run_id` of `tenant` shown ended in the run table, by a row changed
    after `stale` (the `updated_at` of an ended row its stream has since left behind; None at first)."""

    tenant: str
    run_id: uuid.UUID
    stale: datetime | None = None


def _ended(conn: psycopg.Connection[Any], keys: frozenset[RunEnd]) -> Mapping[RunEnd, datetime]:
    """Each key whose run the table shows ended (by a row newer than its `stale`), with the row's
    `updated_at`."""
    pairs = sorted({(k.tenant, k.run_id) for k in keys})
    params = {
        "tenants": [t for t, _ in pairs],
        "run_ids": [r for _, r in pairs],
        "ended": sorted(TERMINAL_RUN),
    }
    try:
        with wrap_exceptions():
            rows = conn.execute(Q["ended_runs"], params).fetchall()
    except MissingRelationError:
        return {}  # no projector has created the run table yet: nothing shows an end
    shown: dict[tuple[str, uuid.UUID], datetime] = {(t, r): at for t, r, at in rows}
    found = {}
    for key in keys:
        at = shown.get((key.tenant, key.run_id))
        if at is not None and (key.stale is None or at > key.stale):
            found[key] = at
    return found


#: Wait with `ProjectionWaiters.wait_until(run_end_watch, RunEnd(tenant, run_id), ...)`: it answers the ended
#: row's `updated_at` (pass it as `stale` to wait again if the run's stream says it is active).
run_end_watch: Watch[RunEnd] = Watch("run_ends", workflow_tables, _ended)

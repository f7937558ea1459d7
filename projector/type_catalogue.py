"""The event type catalogue: how many events of each type and stored version each tenant's log holds.

Shipped with ledgerflow and opt-in (add `projector.type_catalogue:event_type_catalogue` to
`LEDGERFLOW_PROJECTIONS`): `ledgerflow events types` reads its counts, a few rows per type, instead of
counting a log of millions of events. The version counted is the one the event was stored at (its
`$schema_version`, or `$upcast_from` when it is read upcast), 0 for events stored without one: a function
of the stored event alone, so a rebuild gives the same counts. Counts add up, so a replay is a rebuild.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from eventstore import UPCAST_FROM_KEY, VERSION_KEY, RecordedEvent
from eventstore.spi import fetch_value, load_queries
from projector.projection import ApplyContext, Projection, Table

Q = load_queries("projector", "type_catalogue.sql")

event_type_catalogue = Projection(
    name="event_type_catalogue",
    version=1,
    per_tenant=True,
    tables=[
        Table(
            "event_type_catalogue",
            """CREATE TABLE {table} (
                   tenant          text    NOT NULL,
                   event_type      text    NOT NULL,
                   schema_version  integer NOT NULL,
                   events          bigint  NOT NULL,
                   PRIMARY KEY (tenant, event_type, schema_version)
               )""",
        )
    ],
)


def stored_version(event: RecordedEvent) -> int:
    """The version `event` was stored at; 0 when it was stored without one."""
    version = event.metadata.get(UPCAST_FROM_KEY, event.metadata.get(VERSION_KEY, 0))
    return version if isinstance(version, int) and not isinstance(version, bool) else 0


@event_type_catalogue.on_batch
def _count_batch(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
    counts = Counter((e.tenant, e.type, stored_version(e)) for e in events)
    ctx.executemany(
        """INSERT INTO {event_type_catalogue} AS c (tenant, event_type, schema_version, events)
           VALUES (%s, %s, %s, %s)
           ON CONFLICT (tenant, event_type, schema_version)
           DO UPDATE SET events = c.events + excluded.events""",
        [(*key, n) for key, n in sorted(counts.items())],
    )


@dataclass(frozen=True, slots=True)
class TypeCount:
    event_type: str
    #: The version the events were stored at; 0: stored without one (counts as version 1).
    schema_version: int
    events: int


def type_counts(conn: psycopg.Connection[Any], tenant: str | None) -> list[TypeCount] | None:
    """Events per type and stored version (one tenant's, or every tenant's), from the catalogue: a read
    of a few rows per type, whatever the log's size. None when the catalogue has never run."""
    if not fetch_value(conn, Q["catalogue_exists"]):
        return None
    rows = conn.execute(Q["type_counts"], {"tenant": tenant}).fetchall()
    return [TypeCount(str(t), int(v), int(n)) for t, v, n in rows]

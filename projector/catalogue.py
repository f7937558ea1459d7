"""The stream catalogue: one row per stream (tenant, stream, category, version, last event time).

Shipped with ledgerflow, used by operators and by the tests. Every column is a function of the stream's
highest-versioned event, never of the order or batches in which events are applied. (The log's resume
order is not always version order within a stream: an append made late in a long transaction carries
that transaction's early id and start time.) So a replay over any range, then catching up, leaves exactly
the rows a rebuild gives, and each tenant's rows come from that tenant's events alone. `version` is also
the number of events in the stream: versions run 1, 2, 3... with no gaps.
"""

from __future__ import annotations

from collections.abc import Sequence

from eventstore import RecordedEvent
from projector.projection import ApplyContext, Projection, Table

stream_catalogue = Projection(
    name="stream_catalogue",
    version=2,
    per_tenant=True,
    replay_in_place=True,
    tables=[
        Table(
            "stream_catalogue",
            """CREATE TABLE {table} (
                   tenant          text        NOT NULL,
                   stream_id       text        NOT NULL,
                   category        text        NOT NULL,
                   version         bigint      NOT NULL,
                   last_event_at   timestamptz NOT NULL,
                   PRIMARY KEY (tenant, stream_id)
               )""",
        )
    ],
)


@stream_catalogue.on_batch
def _catalogue_batch(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
    # One row per stream per batch: its highest-versioned event in this batch. The upsert keeps whichever
    # of the stored and the new event has the higher version, so the result does not depend on the order.
    latest: dict[tuple[str, str], RecordedEvent] = {}
    for e in events:
        key = (e.tenant, e.stream_id)
        if key not in latest or e.stream_version > latest[key].stream_version:
            latest[key] = e
    ctx.executemany(
        """INSERT INTO {stream_catalogue} AS c (tenant, stream_id, category, version, last_event_at)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (tenant, stream_id) DO UPDATE
              SET version = excluded.version, last_event_at = excluded.last_event_at
            WHERE excluded.version > c.version""",
        [(e.tenant, e.stream_id, e.category, e.stream_version, e.recorded_at) for e in latest.values()],
    )

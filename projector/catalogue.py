"""The stream catalogue: one row per stream (tenant, stream, category, version, last event time).

Shipped with ledgerflow, used by operators and by the tests. Its handler is an upsert that keeps the
highest version seen, so it is also safe to replay over.
"""

from __future__ import annotations

from collections.abc import Sequence

from eventstore import RecordedEvent
from projector.projection import ApplyContext, Projection, Table

stream_catalogue = Projection(
    name="stream_catalogue",
    version=1,
    tables=[
        Table(
            "stream_catalogue",
            """CREATE TABLE {table} (
                   tenant          text        NOT NULL,
                   stream_id       text        NOT NULL,
                   category        text        NOT NULL,
                   version         bigint      NOT NULL,
                   events          bigint      NOT NULL,
                   last_event_at   timestamptz NOT NULL,
                   PRIMARY KEY (tenant, stream_id)
               )""",
        )
    ],
)


@stream_catalogue.on_batch
def _catalogue_batch(ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
    # One row per stream per batch: the latest event of each stream in this batch.
    latest: dict[tuple[str, str], RecordedEvent] = {}
    counts: dict[tuple[str, str], int] = {}
    for e in events:
        key = (e.tenant, e.stream_id)
        counts[key] = counts.get(key, 0) + 1
        if key not in latest or e.stream_version > latest[key].stream_version:
            latest[key] = e
    ctx.executemany(
        """INSERT INTO {stream_catalogue} AS c (tenant, stream_id, category, version, events, last_event_at)
           VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (tenant, stream_id) DO UPDATE
              SET version = greatest(c.version, excluded.version),
                  events = c.events + excluded.events,
                  last_event_at = greatest(c.last_event_at, excluded.last_event_at)""",
        [
            (e.tenant, e.stream_id, e.category, e.stream_version, counts[key], e.recorded_at)
            for key, e in latest.items()
        ],
    )

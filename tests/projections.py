"""Projections used by the tests (importable by worker subprocesses as `tests.projections:...`)."""

from __future__ import annotations

from eventstore import RecordedEvent
from projector import ApplyContext, Projection, Table

#: Event ids that make the counter's handler fail, until removed (tests flip this in-process).
POISONED: set[str] = set()


def make_counter(name: str = "test_counter", policy: str = "block", schema: str = "ledgerflow") -> Projection:
    """Counts events per stream and records how often each event was applied (must stay 1)."""
    counter = Projection(
        name=name,
        version=1,
        schema=schema,
        failure_policy=policy,  # type: ignore[arg-type]
        tables=[
            Table(
                "counts",
                "CREATE TABLE {table} (stream_id text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)",
            ),
            Table("applied", "CREATE TABLE {table} (position bigint PRIMARY KEY, times int NOT NULL)"),
        ],
    )

    @counter.on_any
    def count(ctx: ApplyContext, event: RecordedEvent) -> None:
        if event.data.get("poison") and str(event.data["poison"]) in POISONED:
            raise ValueError(f"poisoned event {event.data['poison']}")
        ctx.execute(
            """INSERT INTO {counts} AS c (stream_id, n, total) VALUES (%s, 1, %s)
               ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, total = c.total + excluded.total""",
            (event.stream_id, int(event.data.get("amount", 0))),
        )
        ctx.execute(
            """INSERT INTO {applied} AS a (position, times) VALUES (%s, 1)
               ON CONFLICT (position) DO UPDATE SET times = a.times + 1""",
            (event.position,),
        )

    return counter


counter = make_counter()
parking_counter = make_counter("test_parking", policy="park")

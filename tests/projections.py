"""Projections used by the tests (importable by worker subprocesses as `tests.projections:...`)."""

from __future__ import annotations

from eventstore import EventStore, RecordedEvent
from projector import ApplyContext, Projection, Table

#: Event ids that make the counter's handler fail, until removed (tests flip this in-process).
POISONED: set[str] = set()


class Crash(BaseException):
    """A process dying in the middle of a batch: nothing in the projector catches it, and the batch's
    transaction rolls back."""


#: Events still to apply before the counter's handler "crashes" (None: never). Tests set it in-process.
CRASH_AFTER: list[int | None] = [None]


def make_counter(
    name: str = "test_counter", policy: str = "block", schema: str = "ledgerflow", partitions: int = 1
) -> Projection:
    """Counts events per stream and records how often each event was applied (must stay 1)."""
    counter = Projection(
        name=name,
        version=1,
        schema=schema,
        partitions=partitions,
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
        left = CRASH_AFTER[0]
        if left is not None:
            if left == 0:
                CRASH_AFTER[0] = None
                raise Crash(f"crashed before applying event {event.position}")
            CRASH_AFTER[0] = left - 1
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


def make_tenant_counter(name: str, schema: str, partitions: int = 1) -> Projection:
    """A per-tenant projection that counts each tenant's events per stream and records how often each event
    was applied (must stay 1): a missed or doubled event shows in its rows."""
    counter = Projection(
        name=name,
        version=1,
        schema=schema,
        per_tenant=True,
        partitions=partitions,
        tables=[
            Table(
                "counts",
                "CREATE TABLE {table} (tenant text NOT NULL, stream_id text NOT NULL, n bigint NOT NULL, "
                "PRIMARY KEY (tenant, stream_id))",
            ),
            Table(
                "applied",
                "CREATE TABLE {table} (tenant text NOT NULL, position bigint PRIMARY KEY, "
                "times int NOT NULL)",
            ),
        ],
    )

    @counter.on_any
    def count(ctx: ApplyContext, event: RecordedEvent) -> None:
        ctx.execute(
            """INSERT INTO {counts} AS c VALUES (%s, %s, 1)
               ON CONFLICT (tenant, stream_id) DO UPDATE SET n = c.n + 1""",
            (event.tenant, event.stream_id),
        )
        ctx.execute(
            """INSERT INTO {applied} AS a VALUES (%s, %s, 1)
               ON CONFLICT (position) DO UPDATE SET times = a.times + 1""",
            (event.tenant, event.position),
        )

    return counter


counter = make_counter()
parking_counter = make_counter("test_parking", policy="park")
#: The counter in 4 segments, and its unpartitioned twin in a schema of its own (drills compare the two).
partitioned_counter = make_counter("test_partitioned", schema="lf_partitioned", partitions=4)
twin_counter = make_counter("test_twin", schema="lf_twin")
#: A per-tenant counter in 3 segments (the API's tenant levers on a partitioned projection).
tenant_partitioned_counter = make_tenant_counter("test_tenant_partitioned", "lf_tenant_partitioned", 3)


def expire_leases(store: EventStore, *projections: str) -> None:
    """End the projections' leases now, as if their worker had died: the next worker takes them over."""
    with store.pool.connection() as conn:
        conn.execute(
            "UPDATE ledgerflow.projection_leases SET expires_at = clock_timestamp()"
            " WHERE projection = ANY(%s)",
            (list(projections),),
        )

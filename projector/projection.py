"""The projection contract: a name, a version, the tables it owns, and handlers per event type.

Handlers write through the `ApplyContext` they are given, inside the transaction that also advances the
projection's cursor. They name their tables as `{table_name}` placeholders, which the context fills in
with the live tables or, during a rebuild or verify, with the shadow copies; so one handler serves both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, LiteralString

import psycopg
from psycopg import sql

from eventstore import InvalidInputError, RecordedEvent

NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
#: The most segments a projection may have (the cursor table's check says the same, migration 0065).
MAX_PARTITIONS = 64

FailurePolicy = Literal["block", "park"]
EventHandler = Callable[["ApplyContext", RecordedEvent], None]
BatchHandler = Callable[["ApplyContext", Sequence[RecordedEvent]], None]


@dataclass(frozen=True)
class Table:
    """A table a projection owns. `ddl` creates it, naming it `{table}`, e.g.
    `CREATE TABLE {table} (tenant text, n bigint, PRIMARY KEY (tenant))`; further statements (indexes)
    may follow, separated by `;`."""

    name: str
    ddl: LiteralString


class ApplyContext:
    """What a handler gets: the transaction's connection and the physical names of its tables."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str, tables: Iterable[str]) -> None:
        self.conn = conn
        self.schema = schema
        self._names = {t: sql.Identifier(schema, t) for t in tables}

    def table(self, name: str) -> sql.Identifier:
        return self._names[name]

    def sql(self, template: LiteralString) -> sql.Composed:
        """`template` with its `{table_name}` placeholders filled in."""
        return sql.SQL(template).format(**self._names)

    def execute(
        self, template: LiteralString, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> None:
        self.conn.execute(self.sql(template), params)

    def executemany(
        self, template: LiteralString, params: Iterable[Sequence[Any] | Mapping[str, Any]]
    ) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(self.sql(template), params)


@dataclass
class Projection:
    """A read model built from the log. Bump `version` when handlers or tables change: the projector
    then rebuilds it in the shadow and swaps it in."""

    name: str
    version: int
    tables: Sequence[Table]
    schema: str = "ledgerflow"
    failure_policy: FailurePolicy = "block"
    #: Only these event types are read (None: all). Cuts reading when a projection needs few types.
    event_types: Sequence[str] | None = None
    #: Every table has a `tenant` column, and a tenant's rows come only from that tenant's events. Such a
    #: projection's rows can be rebuilt, replayed and verified one tenant at a time, by that tenant's admin.
    per_tenant: bool = False
    #: Re-applying events that were already applied leaves the tables as a rebuild would make them, so a
    #: replay may move the cursor back and let the live worker re-apply. A projection that cannot promise
    #: this (counters, inserts without upserts) is replayed by a shadow rebuild instead.
    replay_in_place: bool = False
    #: Split the streams into this many segments, each applied under a lease of its own, so several
    #: workers catch the projection up at once (`projector.segments`). Order is kept within a stream, not
    #: between streams: a projection that needs the log's global order keeps 1. Changing it is a rebuild.
    partitions: int = 1
    handlers: dict[str, EventHandler] = field(default_factory=dict)
    any_handler: EventHandler | None = None
    batch_handler: BatchHandler | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise InvalidInputError(f"projection name {self.name!r} is invalid: use ^[a-z][a-z0-9_]{{0,40}}$")
        if not self.tables:
            raise InvalidInputError(f"projection {self.name!r} owns no tables")
        if (
            isinstance(self.partitions, bool)
            or not isinstance(self.partitions, int)
            or not 1 <= self.partitions <= MAX_PARTITIONS
        ):
            raise InvalidInputError(
                f"partitions={self.partitions!r} of {self.name!r} is invalid: use 1 to {MAX_PARTITIONS}"
            )
        for t in self.tables:
            if not NAME.match(t.name):
                raise InvalidInputError(f"table name {t.name!r} of {self.name!r} is invalid")

    def on(self, *event_types: str) -> Callable[[EventHandler], EventHandler]:
        """Decorator: handle these event types one event at a time."""

        def register(fn: EventHandler) -> EventHandler:
            for t in event_types:
                self.handlers[t] = fn
            return fn

        return register

    def on_any(self, fn: EventHandler) -> EventHandler:
        """Decorator: handle every event (after no type-specific handler matched)."""
        self.any_handler = fn
        return fn

    def on_batch(self, fn: BatchHandler) -> BatchHandler:
        """Decorator: handle a whole batch at once (e.g. one upsert for many events)."""
        self.batch_handler = fn
        return fn

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    def apply(self, ctx: ApplyContext, events: Sequence[RecordedEvent]) -> None:
        if self.batch_handler is not None:
            self.batch_handler(ctx, events)
            return
        for event in events:
            handler = self.handlers.get(event.type, self.any_handler)
            if handler is not None:
                handler(ctx, event)

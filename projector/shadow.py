"""Building a projection's tables from the log into a scratch schema: the engine of rebuild and verify.

The build applies the log in order, as the live worker does, and keeps the live projection's decisions
about failures (skipped events stay skipped, parked streams stay parked) so both copies can agree.
With a tenant, it reads only that tenant's events: the scratch copy then holds that tenant's rows of a
per-tenant projection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from eventstore import Cursor, EventStore, RecordedEvent
from projector import failure_rows, run_rows
from projector.projection import ApplyContext, Projection
from projector.segments import stream_segment

#: Called after every batch with (events processed so far, build cursor, target cursor).
Progress = Callable[[int, Cursor, Cursor], None]


class ShadowBuild:
    """Applies the log, in order, to a projection's tables in `schema`."""

    def __init__(
        self,
        store: EventStore,
        projection: Projection,
        schema: str,
        run_id: int,
        batch_size: int,
        *,
        tenant: str | None = None,
    ) -> None:
        self.store, self.projection, self.schema = store, projection, schema
        self.run_id, self.batch_size, self.tenant = run_id, batch_size, tenant
        self.cursor = Cursor()
        self.events = 0
        with store.pool.connection() as conn:
            # Of every segment too: each keeps its own failures (`projector.segments`).
            self._skipped = failure_rows.projection_skipped_positions(conn, projection.name)
            failures = failure_rows.projection_open_failures(conn, projection.name)
        self._parked = {(f.tenant, f.stream_id): f.stream_version for f in failures if f.policy == "park"}
        self._segments: dict[int, Cursor] | None = None
        self._partitions = 1

    def limit_to(self, segments: dict[int, Cursor], partitions: int) -> None:
        """From now on apply a stream's events only up to its segment's cursor in `segments` (a verify of a
        partitioned projection, whose segments stand at different cursors, or the copy of a tenant's rows
        fenced at each segment's cursor)."""
        self._segments, self._partitions = segments, partitions

    def wanted(self, e: RecordedEvent) -> bool:
        """Whether the build applies `e`: kept (`kept`), and within its segment's limit if limited."""
        if self._segments is not None:
            limit = self._segments.get(stream_segment(e.stream_id, self._partitions))
            if limit is None or e.cursor > limit:
                return False
        return self.kept(e)

    def kept(self, e: RecordedEvent) -> bool:
        """The live projection's decisions about failures: skipped events and parked streams stay so."""
        parked_at = self._parked.get((e.tenant, e.stream_id))
        return e.position not in self._skipped and (parked_at is None or e.stream_version < parked_at)

    def run_until(
        self, target: Cursor | None, progress: Progress | None, conn: psycopg.Connection[Any] | None = None
    ) -> None:
        """Apply every event up to and including `target` (None: everything readable now); in `conn`'s
        transaction if given. The build's cursor never passes `target`."""
        while target is None or self.cursor < target:
            page = self.store.read_all(
                self.cursor,
                limit=self.batch_size,
                tenant=self.tenant,
                types=self.projection.event_types,
                conn=conn,
            )
            if not page.events and not page.caught_up:
                continue  # the transaction at the horizon ended while the page was read: read again
            events = [e for e in page.events if target is None or e.cursor <= target]
            if len(events) < len(page.events) or page.caught_up:
                # Past the target, or everything readable is read: the build stands at the end.
                reached = max(page.cursor, self.cursor)
                end = reached if target is None else min(reached, target)
            else:
                end = events[-1].cursor
            if not events and end <= self.cursor:
                break
            self._apply(events, end, conn)
            if progress is not None:
                progress(self.events, self.cursor, target or end)
            if target is None and page.caught_up:
                break

    def _apply(
        self, events: Sequence[RecordedEvent], end: Cursor, conn: psycopg.Connection[Any] | None
    ) -> None:
        wanted = [e for e in events if self.wanted(e)]
        if conn is not None:
            self._apply_in(conn, wanted, end, len(events))
        else:
            with self.store.pool.connection() as own, own.transaction():
                self._apply_in(own, wanted, end, len(events))
        self.cursor = max(self.cursor, end)
        self.events += len(events)

    def _apply_in(
        self, conn: psycopg.Connection[Any], events: list[RecordedEvent], end: Cursor, n: int
    ) -> None:
        if events:
            self.projection.apply(ApplyContext(conn, self.schema, self.projection.table_names), events)
        run_rows.run_progress(conn, self.run_id, end, n)

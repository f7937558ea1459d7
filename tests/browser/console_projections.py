"""A projection whose rebuild a test can hold half-way (importable as
`tests.browser.console_projections:held`), so the console can be seen following a rebuild in progress."""

from __future__ import annotations

import threading

from eventstore import RecordedEvent
from projector import ApplyContext, Projection, Table

#: Cleared by a test to hold rebuilds at the event marked `hold_rebuild`; set again to let them go on.
REBUILDS_MAY_PASS = threading.Event()
REBUILDS_MAY_PASS.set()

held = Projection(
    name="test_held",
    version=1,
    tables=[Table("seen", "CREATE TABLE {table} (position bigint PRIMARY KEY)")],
)


@held.on_any
def see(ctx: ApplyContext, event: RecordedEvent) -> None:
    # Only a shadow build waits (the live tables are in the projection's own schema): the live worker
    # keeps up while a rebuild stands still at the marked event.
    if event.data.get("hold_rebuild") and ctx.schema != held.schema:
        REBUILDS_MAY_PASS.wait(timeout=60)
    ctx.execute("INSERT INTO {seen} (position) VALUES (%s) ON CONFLICT DO NOTHING", (event.position,))

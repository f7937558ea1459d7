"""The workflow run tables brought up to date in the test's process (the projector's own worker, run once)."""

from __future__ import annotations

from eventstore import EventStore
from projector import Projection, ProjectorWorker
from workflows import workflow_tables


def project_runs(store: EventStore, *also: Projection) -> None:
    """Apply every event written so far to the run tables (and to `also`), then let the leases go."""
    worker = ProjectorWorker(store, [workflow_tables, *also])
    try:
        worker.run_until_caught_up()
    finally:
        worker.release_all()

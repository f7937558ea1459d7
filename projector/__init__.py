"""Projections: read tables built from the log through durable cursors, shared by workers through
leases, with every run and failure recorded."""

from eventstore._guard import require_ledgerflow_packages

require_ledgerflow_packages("eventstore")

from projector.catalogue import stream_catalogue  # noqa: E402
from projector.errors import RunInProgressError  # noqa: E402
from projector.projection import ApplyContext, Projection, Table  # noqa: E402
from projector.rebuild import (  # noqa: E402
    PendingRun,
    RebuildResult,
    ReplayResult,
    VerifyResult,
    rebuild,
    replay,
    start_rebuild,
    start_replay,
    start_verify,
    sweep_abandoned,
    verify,
)
from projector.registry import load_projections  # noqa: E402
from projector.runner import LeaseLost, RetrySettings  # noqa: E402
from projector.worker import ProjectorWorker, WorkerSettings  # noqa: E402

__ledgerflow_package__ = True

__all__ = [
    "ApplyContext",
    "LeaseLost",
    "PendingRun",
    "Projection",
    "ProjectorWorker",
    "RebuildResult",
    "ReplayResult",
    "RetrySettings",
    "RunInProgressError",
    "Table",
    "VerifyResult",
    "WorkerSettings",
    "load_projections",
    "rebuild",
    "replay",
    "start_rebuild",
    "start_replay",
    "start_verify",
    "stream_catalogue",
    "sweep_abandoned",
    "verify",
]

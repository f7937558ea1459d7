"""Projections: read tables built from the log through durable cursors, shared by workers through
leases, with every run and failure recorded."""

from eventstore._guard import require_ledgerflow_packages

require_ledgerflow_packages("eventstore")

from projector.catalogue import stream_catalogue  # noqa: E402
from projector.projection import ApplyContext, Projection, Table  # noqa: E402
from projector.rebuild import RebuildResult, VerifyResult, rebuild, replay, verify  # noqa: E402
from projector.registry import load_projections  # noqa: E402
from projector.runner import LeaseLost, RetrySettings  # noqa: E402
from projector.worker import ProjectorWorker, WorkerSettings  # noqa: E402

__ledgerflow_package__ = True

__all__ = [
    "ApplyContext",
    "LeaseLost",
    "Projection",
    "ProjectorWorker",
    "RebuildResult",
    "RetrySettings",
    "Table",
    "VerifyResult",
    "WorkerSettings",
    "load_projections",
    "rebuild",
    "replay",
    "stream_catalogue",
    "verify",
]

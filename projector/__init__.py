"""Projections: read tables built from the log through durable cursors, shared by workers through
leases, with every run and failure recorded."""

from eventstore.spi import require_ledgerflow_packages

require_ledgerflow_packages("eventstore")

from projector.catalogue import stream_catalogue  # noqa: E402
from projector.errors import RunInProgressError  # noqa: E402
from projector.failure_rows import Failure, list_failures, request_failure_retry, request_failure_skip  # noqa: E402
from projector.health import ProjectionHealth, SegmentHealth, projection_health  # noqa: E402
from projector.listener import ProjectionWaiters, TooManyWaitersError, Watch  # noqa: E402
from projector.operator_runs import (  # noqa: E402
    PendingRun,
    RebuildResult,
    ReplayResult,
    VerifyResult,
    default_actor,
    sweep_abandoned,
)
from projector.projection import ApplyContext, Projection, Table  # noqa: E402
from projector.rebuild import rebuild, start_rebuild  # noqa: E402
from projector.registry import find, load_projections  # noqa: E402
from projector.replay import replay, start_replay  # noqa: E402
from projector.retries import RetrySettings  # noqa: E402
from projector.run_rows import Run, get_run, list_runs  # noqa: E402
from projector.runner import LeaseLost  # noqa: E402
from projector.segments import PartitionsChangedError, stream_segment  # noqa: E402
from projector.tables import missing_tables  # noqa: E402
from projector.type_catalogue import TypeCount, event_type_catalogue, type_counts  # noqa: E402
from projector.verify import start_verify, verify  # noqa: E402
from projector.waiting import ProjectionBehindError, wait_for  # noqa: E402
from projector.worker import ProjectorWorker  # noqa: E402
from projector.worker_settings import WorkerSettings  # noqa: E402

__ledgerflow_package__ = True

__all__ = [
    "ApplyContext",
    "Failure",
    "LeaseLost",
    "PartitionsChangedError",
    "PendingRun",
    "Projection",
    "ProjectionBehindError",
    "ProjectionHealth",
    "ProjectionWaiters",
    "ProjectorWorker",
    "RebuildResult",
    "ReplayResult",
    "RetrySettings",
    "Run",
    "RunInProgressError",
    "SegmentHealth",
    "Table",
    "TooManyWaitersError",
    "TypeCount",
    "VerifyResult",
    "Watch",
    "WorkerSettings",
    "default_actor",
    "event_type_catalogue",
    "find",
    "get_run",
    "list_failures",
    "list_runs",
    "load_projections",
    "missing_tables",
    "projection_health",
    "rebuild",
    "replay",
    "request_failure_retry",
    "request_failure_skip",
    "start_rebuild",
    "start_replay",
    "start_verify",
    "stream_catalogue",
    "stream_segment",
    "sweep_abandoned",
    "type_counts",
    "verify",
    "wait_for",
]

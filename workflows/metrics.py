"""Workflow metrics through OpenTelemetry: what a dashboard of recovery and execution needs.

Instruments come from the global meter provider; `ops.telemetry` installs an exporter. Without one
they cost next to nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import structlog
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

if TYPE_CHECKING:
    from workflows.limits import LimitUsage
    from workflows.recovery import RecoveryReport

_log = structlog.get_logger(__name__)

_meter = metrics.get_meter("ledgerflow.workflows")

nodes_claimed = _meter.create_counter(
    "ledgerflow.workflow.nodes_claimed", description="Nodes claimed by workers"
)
nodes_finished = _meter.create_counter(
    "ledgerflow.workflow.nodes_finished", description="Node attempts ended, by outcome"
)
node_retries = _meter.create_counter("ledgerflow.workflow.node_retries", description="Node retries scheduled")
node_duration = _meter.create_histogram(
    "ledgerflow.workflow.node_duration", unit="ms", description="Duration of node attempts"
)
leases_reclaimed = _meter.create_counter(
    "ledgerflow.workflow.leases_reclaimed", description="Node leases taken back from dead or stuck workers"
)
recoveries = _meter.create_counter(
    "ledgerflow.workflow.recoveries", description="Recovery sweeps that found work"
)
recovery_duration = _meter.create_histogram(
    "ledgerflow.workflow.recovery_duration", unit="ms", description="Duration of recovery sweeps"
)


def record_recovery(report: RecoveryReport, trigger: str) -> None:
    recovery_duration.record(report.duration_ms, {"trigger": trigger})
    if report.found:
        recoveries.add(1, {"trigger": trigger})
        leases_reclaimed.add(report.reclaimed, {"reason": "lapsed"})
        leases_reclaimed.add(report.stuck, {"reason": "stuck"})


# -- limits per key: slots in use and nodes waiting, read from the database when metrics are collected ----
# The counts are the same for every process (they are the database's), so one process reports them: the
# one that serves the API registers its reader (ops/api/limits.py), and workers report nothing twice.

_limit_reader: Callable[[], Sequence[LimitUsage]] | None = None


def watch_limit_usage(read: Callable[[], Sequence[LimitUsage]] | None) -> None:
    """Report each limit's slots in use and nodes waiting, from `read`, at every collection (None: stop)."""
    global _limit_reader
    _limit_reader = read


def _limit_gauge(kind: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        read = _limit_reader
        if read is None:
            return []
        try:
            found = read()
        except Exception as exc:  # a collection during an outage reports nothing, and says why once
            _log.warning("workflow_limit_usage_unavailable", error=str(exc))
            return []
        return [Observation(getattr(u, kind), {"limit": u.name}) for u in found]

    return observe


limit_in_use = _meter.create_observable_gauge(
    "ledgerflow.workflow.limit_in_use",
    callbacks=[_limit_gauge("in_use")],
    description="Nodes running under each limit (slots in use), across every worker",
)
limit_waiting = _meter.create_observable_gauge(
    "ledgerflow.workflow.limit_waiting",
    callbacks=[_limit_gauge("waiting")],
    description="Nodes of each limit ready to run and not started: waiting for a slot or a worker",
)

"""Workflow metrics through OpenTelemetry: what a dashboard of recovery and execution needs.

Instruments come from the global meter provider; `ops.telemetry` installs an exporter. Without one
they cost next to nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import metrics

if TYPE_CHECKING:
    from workflows.recovery import RecoveryReport

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

"""The running pieces a ledgerflow process shares between its roles (API, console, workers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eventstore import EventStore, open_store
from ops.settings import Settings
from projector import Projection, load_projections
from workflows import Engine, WorkflowRegistry, workflow_tables
from workflows.loading import load_workflows


@dataclass
class Services:
    settings: Settings
    store: EventStore
    registry: WorkflowRegistry
    projections: list[Projection] = field(default_factory=list)

    @property
    def engine(self) -> Engine:
        return Engine(self.store, self.registry)

    def close(self) -> None:
        self.store.close()


def open_services(settings: Settings, *, name: str = "ledgerflow") -> Services:
    """Open the store (embedded PostgreSQL unless a URL is set; migrations applied), load the configured
    workflows and projections. The workflow tables projection is always included."""
    store = open_store(settings, name=name)
    projections = load_projections(settings.projection_paths)
    if all(p.name != workflow_tables.name for p in projections):
        projections.append(workflow_tables)
    return Services(settings, store, load_workflows(settings.workflow_paths), projections)

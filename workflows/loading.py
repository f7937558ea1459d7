"""Finding workflow definitions named by import paths in configuration.

`LEDGERFLOW_WORKFLOWS="myapp.flows:registry,myapp.more:pipeline"`: each entry is `module:attribute`, the
attribute a WorkflowRegistry, a Workflow, or a list of Workflows.
"""

from __future__ import annotations

from collections.abc import Iterable

from eventstore import ConfigurationError
from eventstore.spi import import_object
from workflows.definition import Workflow
from workflows.workflow_registry import WorkflowRegistry


def load_workflows(paths: Iterable[str]) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    for path in paths:
        value = import_object(path, "workflows")
        if isinstance(value, WorkflowRegistry):
            found = value.definitions()  # every version: runs go on with the one they started with
            for limit in value.limits.values():  # the limits its nodes name come with them
                registry.limit(limit.name, concurrency=limit.concurrency, per_minute=limit.per_minute)
        elif isinstance(value, Workflow):
            found = [value]
        elif isinstance(value, list | tuple) and all(isinstance(v, Workflow) for v in value):
            found = list(value)
        else:
            raise ConfigurationError(f"{path!r} holds a {type(value).__name__}, not workflows")
        for wf in found:
            registry.register(wf)
    return registry

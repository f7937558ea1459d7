"""DAG workflows on the event log: runs that survive crashes, restarts and retries without losing data
or paying twice for work already done."""

from eventstore._guard import require_ledgerflow_packages

require_ledgerflow_packages("eventstore", "projector")

from workflows.context import NodeContext  # noqa: E402
from workflows.definition import DefinitionError, NodeSpec, RetryPolicy, Workflow, WorkflowRegistry  # noqa: E402
from workflows.engine import Engine, Started  # noqa: E402
from workflows.errors import NodeLeaseLost, NodeTimeout, RunCancelled, RunStateError, WorkerStopping  # noqa: E402
from workflows.projections import workflow_tables  # noqa: E402
from workflows.scheduler import NodeStatus  # noqa: E402
from workflows.state import RunState  # noqa: E402
from workflows.worker import WorkerSettings, WorkflowWorker  # noqa: E402

__ledgerflow_package__ = True

__all__ = [
    "DefinitionError",
    "Engine",
    "NodeContext",
    "NodeLeaseLost",
    "NodeSpec",
    "NodeStatus",
    "NodeTimeout",
    "RetryPolicy",
    "RunCancelled",
    "RunState",
    "RunStateError",
    "Started",
    "WorkerSettings",
    "WorkerStopping",
    "Workflow",
    "WorkflowRegistry",
    "WorkflowWorker",
    "workflow_tables",
]

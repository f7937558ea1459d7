"""DAG workflows on the event log: runs that survive crashes, restarts and retries without losing data
or paying twice for work already done."""

from eventstore.spi import require_ledgerflow_packages

require_ledgerflow_packages("eventstore", "projector")

from workflows.async_context import AsyncNodeContext  # noqa: E402
from workflows.bulk import run_bulk_action  # noqa: E402
from workflows.bulk_kinds import (  # noqa: E402
    KINDS as BULK_KINDS,
)
from workflows.bulk_records import (  # noqa: E402
    MAX_BULK_RUNS,
    BulkAction,
    BulkLimitError,
    BulkPlan,
    bulk_action,
    create_bulk_action,
    filter_from_json,
    filter_to_json,
    plan_bulk,
    unfinished_bulk_actions,
)
from workflows.caps import RunCaps  # noqa: E402
from workflows.context import NodeContext  # noqa: E402
from workflows.debounce import MAX_WINDOW as MAX_DEBOUNCE_WINDOW  # noqa: E402
from workflows.debounce import Debounce, PendingBurst  # noqa: E402
from workflows.debounce import pending as pending_debounces  # noqa: E402
from workflows.definition import PRIORITY_MAX, PRIORITY_MIN, Workflow  # noqa: E402
from workflows.definition_checks import DefinitionError  # noqa: E402
from workflows.demo import ONTOLOGY_EXTRACTED, sample_schema  # noqa: E402
from workflows.demo import registry as demo_registry  # noqa: E402
from workflows.engine import Engine  # noqa: E402
from workflows.errors import (  # noqa: E402
    ContinueAsNew,
    NodeLeaseLost,
    NodeStuckError,
    NodeTimeout,
    PayloadTooLargeError,
    RepeatedStepKeyError,
    RunCancelled,
    RunSignalLimitError,
    RunStateError,
    SignalTimeout,
    WorkerStopping,
)
from workflows.events import (  # noqa: E402
    NODE_CHECKPOINT,
    NODE_RECLAIMED,
    RESERVED_CATEGORIES,
    RESERVED_TYPE_PREFIX,
    STEP_RECORDED,
    WorkflowEventError,
    run_stream,
)
from workflows.history import HistoryEntry, HistoryPage, run_history  # noqa: E402
from workflows.limits import LimitUsage  # noqa: E402
from workflows.limits import read_usage as limit_usage  # noqa: E402
from workflows.loading import load_workflows  # noqa: E402
from workflows.metrics import watch_limit_usage  # noqa: E402
from workflows.node_spec import NodeSpec, RetryPolicy  # noqa: E402
from workflows.presence import shared_worker_names  # noqa: E402
from workflows.projections import workflow_tables  # noqa: E402
from workflows.queue_status import QueueSummary, Recovery, recent_recoveries  # noqa: E402
from workflows.queue_status import summary as queue_summary  # noqa: E402
from workflows.quotas import (  # noqa: E402
    Quota,
    TenantQuotas,
    clear_tenant_quota,
    set_tenant_quota,
    tenant_quota_rows,
)
from workflows.read import list_runs, run_nodes  # noqa: E402
from workflows.recovery import sweep  # noqa: E402
from workflows.release_marks import Release  # noqa: E402
from workflows.releases import (  # noqa: E402
    RetentionSettings,
    parse_duration,
    release_of,
    release_run,
    restore_run,
)
from workflows.retention import RetentionPlan, plan_retention, retention_pass  # noqa: E402
from workflows.retention_worker import RetentionWorker  # noqa: E402
from workflows.run_ends import RunEnd, run_end_watch  # noqa: E402
from workflows.run_search import RunFilter, RunPage, search_runs, tag_filter  # noqa: E402
from workflows.run_sources import Schedule, Trigger  # noqa: E402
from workflows.run_starts import Started  # noqa: E402
from workflows.run_state import NodeState, RunState  # noqa: E402
from workflows.scheduler import NodeStatus  # noqa: E402
from workflows.schedules import ScheduleRow, list_schedules, next_tick  # noqa: E402
from workflows.tags import TagLimitError, TagLimits  # noqa: E402
from workflows.triggers import run_started_by  # noqa: E402
from workflows.versions import VersionWait, versions_without_worker  # noqa: E402
from workflows.worker import WorkflowWorker  # noqa: E402
from workflows.worker_settings import WorkerSettings  # noqa: E402
from workflows.workflow_registry import WorkflowRegistry  # noqa: E402

__ledgerflow_package__ = True

__all__ = [
    "BULK_KINDS",
    "MAX_BULK_RUNS",
    "MAX_DEBOUNCE_WINDOW",
    "NODE_CHECKPOINT",
    "NODE_RECLAIMED",
    "ONTOLOGY_EXTRACTED",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RESERVED_CATEGORIES",
    "RESERVED_TYPE_PREFIX",
    "STEP_RECORDED",
    "AsyncNodeContext",
    "BulkAction",
    "BulkLimitError",
    "BulkPlan",
    "ContinueAsNew",
    "Debounce",
    "DefinitionError",
    "Engine",
    "HistoryEntry",
    "HistoryPage",
    "LimitUsage",
    "NodeContext",
    "NodeLeaseLost",
    "NodeSpec",
    "NodeState",
    "NodeStatus",
    "NodeStuckError",
    "NodeTimeout",
    "PayloadTooLargeError",
    "PendingBurst",
    "QueueSummary",
    "Quota",
    "Recovery",
    "Release",
    "RepeatedStepKeyError",
    "RetentionPlan",
    "RetentionSettings",
    "RetentionWorker",
    "RetryPolicy",
    "RunCancelled",
    "RunCaps",
    "RunEnd",
    "RunFilter",
    "RunPage",
    "RunSignalLimitError",
    "RunState",
    "RunStateError",
    "Schedule",
    "ScheduleRow",
    "SignalTimeout",
    "Started",
    "TagLimitError",
    "TagLimits",
    "TenantQuotas",
    "Trigger",
    "VersionWait",
    "WorkerSettings",
    "WorkerStopping",
    "Workflow",
    "WorkflowEventError",
    "WorkflowRegistry",
    "WorkflowWorker",
    "bulk_action",
    "clear_tenant_quota",
    "create_bulk_action",
    "demo_registry",
    "filter_from_json",
    "filter_to_json",
    "limit_usage",
    "list_runs",
    "list_schedules",
    "load_workflows",
    "next_tick",
    "parse_duration",
    "pending_debounces",
    "plan_bulk",
    "plan_retention",
    "queue_summary",
    "recent_recoveries",
    "release_of",
    "release_run",
    "restore_run",
    "retention_pass",
    "run_bulk_action",
    "run_end_watch",
    "run_history",
    "run_nodes",
    "run_started_by",
    "run_stream",
    "sample_schema",
    "search_runs",
    "set_tenant_quota",
    "shared_worker_names",
    "sweep",
    "tag_filter",
    "tenant_quota_rows",
    "unfinished_bulk_actions",
    "versions_without_worker",
    "watch_limit_usage",
    "workflow_tables",
]

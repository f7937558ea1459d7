"""The workflow engine's public API: start, inspect, signal, cancel, retry and refresh runs.

Every state change is an event in the run's stream, appended with optimistic concurrency on the
stream version; the scheduler's queue changes in the same transaction. A conflicting concurrent change
makes the loser re-read the run and decide again.

`Engine` is put together from one part per job:

* `workflows.engine_core`: its collaborators, reading runs, transactions and the concurrency loop;
* `workflows.run_starts`: starting runs (keys, idempotency keys, quotas, debounce, successors);
* `workflows.run_signals`: signals to runs;
* `workflows.operator_actions`: cancel, terminate, pause, resume, retry and refresh.
"""

from __future__ import annotations

from workflows.operator_actions import OperatorActions
from workflows.run_signals import RunSignals
from workflows.run_starts import RunStarts


class Engine(RunStarts, RunSignals, OperatorActions):
    """Runs of the workflows of `registry`, in `store` (see `EngineCore` for the constructor)."""

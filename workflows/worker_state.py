"""What the parts of a workflow worker share: its collaborators and settings, the nodes it runs, its
locks, and waiting out an outage of the database.

`workflows.worker.WorkflowWorker` is built in layers, each a subclass of the one below: this state,
running claimed nodes (`workflows.node_runs`), claiming them (`workflows.node_claims`), and the worker
itself, its loop, leases, recovery and stop (`workflows.worker`), which sets every field here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from eventstore.spi import Outage, is_unavailable, wait_until_available
from workflows.aio import Kinds, NodeLoop
from workflows.context import NodeContext
from workflows.engine import Engine
from workflows.interrupts import InterruptBackoff
from workflows.lifecycle import Lifecycle
from workflows.queue_claims import Claim, Claimant
from workflows.quotas import TenantQuotas
from workflows.worker_settings import WorkerSettings
from workflows.workflow_registry import WorkflowRegistry

T = TypeVar("T")


class DatabaseGone(Exception):
    """The database stayed unavailable until the worker stopped; the node's lease lapses and recovery
    takes it back."""


class WorkerState:
    engine: Engine
    #: The tenants' quotas a debounced burst's run is admitted under when it fires (None: none).
    quotas: TenantQuotas | None
    registry: WorkflowRegistry
    settings: WorkerSettings
    name: str
    instance: str
    lifecycle: Lifecycle
    stopping: threading.Event
    outage: Outage
    _wake: threading.Event
    _running: dict[int, tuple[Claim, NodeContext | None]]
    #: Tokens of nodes whose end is being recorded: their rows may be gone before they leave _running.
    _ending: set[int]
    _lock: threading.Lock
    #: Held while claiming and starting, by the claim loop and by recovery alike (see `_take_back`).
    _claiming: threading.Lock
    _pool: ThreadPoolExecutor
    _loop: NodeLoop
    #: Tokens of the nodes in _running that run (or are about to run) on the event loop.
    _on_loop: set[int]
    _kinds: Kinds
    #: Pushes claims back after nodes were interrupted by the database (see workflows.interrupts).
    _interrupts: InterruptBackoff
    _claimant: Claimant

    @property
    def id(self) -> str:
        return f"{self.name}/{self.instance}"

    def _wait_for_database(self) -> bool:
        return wait_until_available(self.engine.store.pool, self.outage, self.stopping)

    def _through_outage(self, fn: Callable[[], T]) -> T:
        """`fn()`, tried again after each outage until it gets through; DatabaseGone if the worker
        stops first."""
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                self.outage.failed(exc)
            if not self._wait_for_database():
                raise DatabaseGone

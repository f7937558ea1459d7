"""Workflow workers on threads of the test process, with settings fast enough for tests: `FAST`, and
`worker_threads`, the body of a test module's `start_worker` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Protocol

from eventstore import EventStore
from workflows import Engine, WorkerSettings, WorkflowRegistry, WorkflowWorker
from workflows.testing import running_worker

FAST = WorkerSettings(
    concurrency=2,
    lease_ttl=2.0,
    heartbeat_interval=0.3,
    recovery_interval=0.3,
    poll_interval=0.05,
    shutdown_grace=1,
)


class StartWorker(Protocol):
    def __call__(
        self, name: str = "w1", *, registry: WorkflowRegistry | None = None, settings: WorkerSettings = FAST
    ) -> WorkflowWorker: ...


@contextmanager
def worker_threads(store: EventStore, registry: WorkflowRegistry) -> Iterator[StartWorker]:
    """Gives `start(name)`, which runs a WorkflowWorker of `registry` (or of the one it is given) with an
    Engine of its own, through `workflows.testing.running_worker`; every worker started is stopped, its
    thread joined, at the end."""
    default = registry
    with ExitStack() as started:

        def start(
            name: str = "w1", *, registry: WorkflowRegistry | None = None, settings: WorkerSettings = FAST
        ) -> WorkflowWorker:
            reg = default if registry is None else registry
            return started.enter_context(running_worker(Engine(store, reg), reg, settings, name=name))

        yield start

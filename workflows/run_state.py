"""A run's state, as its stream folds it (`workflows.run_fold`): the run, its nodes and the signals sent
to it. Pure: no I/O.

The worker reads it to know what a node may reuse (checkpoints, memoized steps, the outputs of its
dependencies) and what to decide next; the run and node tables (`workflows.projections`) are rows of it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventstore.spi import json_dumps
from workflows import event_models as em
from workflows.scheduler import NodeStatus

#: Statuses after which a run no longer moves on its own.
TERMINAL_RUN = {"succeeded", "failed", "cancelled", "continued"}


@dataclass
class NodeState:
    name: str
    status: NodeStatus = NodeStatus.PENDING
    #: Tries of the node: its first run, retries and takeovers after a crash. A wake after a timer or a
    #: signal wait goes on with the same attempt and counts in `wakes` instead.
    attempt: int = 0
    wakes: int = 0
    failures: int = 0
    crashes: int = 0
    token: int | None = None
    worker: str | None = None
    output: Any = None
    generation: int | None = None
    error: str | None = None
    progress: tuple[int, int | None, str] | None = None
    checkpoints: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, Any] = field(default_factory=dict)
    children: dict[str, str] = field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: Where the node stands in the run's topological order (the order of `RunStarted.nodes`).
    position: int = 0
    #: Checkpoint events since the node last started afresh (shown in the node table).
    checkpoints_taken: int = 0
    #: An operator flag: the node ran past its timeout; cleared when it is claimed or the run reopens.
    stuck: bool = False
    duration_ms: float | None = None
    updated_at: datetime | None = None
    #: The waits of the node's body (timers and signal waits) by key: their due time or timeout, if any,
    #: as first recorded, so that the body run again waits for the same moment.
    waits: dict[str, datetime | None] = field(default_factory=dict)
    #: Ended signal waits by key: the index of the run's signal each took, None for a timeout.
    taken: dict[str, int | None] = field(default_factory=dict)
    #: While WAITING: the signal it waits for (None for a timer) and when it wakes at the latest.
    waiting_for: str | None = None
    wake_at: datetime | None = None
    #: Bytes of JSON of what the node holds: its output (unless None), step results and checkpoint
    #: outputs. Their sum over the run is bounded by LEDGERFLOW_MAX_RUN_STATE_BYTES (workflows.caps).
    held_bytes: int = 0


@dataclass(frozen=True)
class ReceivedSignal:
    """A signal sent to the run, by reference: its payload stays in the log (at `version` of the run's
    stream) until a node's wait takes it (`Engine.signal_payload`), so that folding a run costs no memory
    for what was sent to it. A signal's payload may be large; its name and place are small."""

    name: str
    at: datetime
    #: The SignalReceived event's version in the run's stream.
    version: int


@dataclass
class RunState:
    run_id: uuid.UUID
    tenant: str
    workflow: str = ""
    key: str | None = None
    input: Any = None
    input_fingerprint: str = ""
    fingerprints: dict[str, str] = field(default_factory=dict)
    #: The log event that started the run, for runs a trigger started.
    triggered_by: em.TriggeringEvent | None = None
    #: The definition's version the run started with: workers go on with that version only.
    workflow_version: str = "1"
    #: The run's priority within its tenant (RunStarted's): higher is claimed first.
    priority: int = 0
    status: str = "running"
    cancel_requested: bool = False
    error: str | None = None
    nodes: dict[str, NodeState] = field(default_factory=dict)
    version: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: The node claimed last, until the run ends.
    current_node: str | None = None
    updated_at: datetime | None = None
    #: Every signal sent to the run, in the order received; a signal's index is its place here.
    signals: list[ReceivedSignal] = field(default_factory=list)
    #: Indexes of the signals some node's wait has taken.
    signals_taken: set[int] = field(default_factory=set)
    #: The run's tags (workflows.tags): its start's, then its RunTagged events' changes.
    tags: dict[str, str] = field(default_factory=dict)
    #: The run whose node started this one (a child run), with its node and parent-close policy; None for
    #: every other run.
    parent: em.ParentLink | None = None
    #: The successor this run continued as (`NodeContext.continue_as_new`), once it has; else None.
    continued_as: str | None = None
    #: The run this one continues (it was started as that run's successor); else None.
    continued_from: str | None = None

    @property
    def parent_run_id(self) -> uuid.UUID | None:
        return uuid.UUID(self.parent.run_id) if self.parent is not None else None

    def node(self, name: str) -> NodeState:
        if name not in self.nodes:
            self.nodes[name] = NodeState(name, position=len(self.nodes))
        return self.nodes[name]

    def untaken_signal(self, name: str) -> int | None:
        """The index of the earliest signal named `name` that no wait has taken yet, or None."""
        return next(
            (i for i, s in enumerate(self.signals) if s.name == name and i not in self.signals_taken), None
        )

    @property
    def statuses(self) -> dict[str, NodeStatus]:
        return {name: n.status for name, n in self.nodes.items()}

    @property
    def paused(self) -> bool:
        """Paused (`Engine.pause`): the run starts no new node until it is resumed."""
        return self.status == "paused"

    @property
    def active(self) -> bool:
        return self.status not in TERMINAL_RUN

    @property
    def held_bytes(self) -> int:
        """Bytes of JSON of the outputs, step results and checkpoint outputs the run's state holds."""
        return sum(n.held_bytes for n in self.nodes.values())

    @property
    def nodes_done(self) -> int:
        return sum(1 for n in self.nodes.values() if n.status == NodeStatus.SUCCEEDED)


def json_bytes(value: Any) -> int:
    """The size of `value` as the log writes it (compact JSON, UTF-8), as the caps count it."""
    return len(json_dumps(value).encode())

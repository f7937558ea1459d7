"""How the CLI shows a run: its nodes as a table, and the run as a JSON object."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ops.cli.common import ICONS

if TYPE_CHECKING:
    from rich.table import Table

    from workflows import NodeState, RunState

#: A waiting node (a timer, or a signal that has not come) beside the other states.
_ICONS = {**ICONS, "waiting": "[blue]◷[/]"}


def waiting_note(n: NodeState) -> str:
    """What a waiting node waits for and until when, in words; "" for a node that does not wait."""
    if n.status != "waiting":
        return ""
    until = n.wake_at.isoformat(timespec="seconds") if n.wake_at else None
    if n.waiting_for is None:
        return f"sleeping until {until}" if until else "sleeping"
    return f"waiting for signal {n.waiting_for}" + (f" until {until}" if until else "")


def node_table(run: RunState) -> Table:
    from rich.table import Table

    table = Table("", "node", "status", "attempt", "progress", "message / error")
    for name, n in run.nodes.items():
        progress = f"{n.progress[0]}/{n.progress[1]}" if n.progress and n.progress[1] else ""
        note = n.error or waiting_note(n) or (n.progress[2] if n.progress else "")
        table.add_row(_ICONS.get(n.status, "?"), name, str(n.status), str(n.attempt), progress, note[:70])
    return table


def run_as_dict(run: RunState) -> dict[str, Any]:
    return {
        "run_id": str(run.run_id),
        "workflow": run.workflow,
        "key": run.key,
        "triggered_by": run.triggered_by.model_dump() if run.triggered_by is not None else None,
        "parent": run.parent.model_dump() if run.parent is not None else None,
        "continued_from": run.continued_from,
        "continued_as": run.continued_as,
        "priority": run.priority,
        "status": run.status,
        "cancel_requested": run.cancel_requested,
        "error": run.error,
        "version": run.version,
        "nodes": {
            name: {
                "status": str(n.status),
                "attempt": n.attempt,
                "generation": n.generation,
                "progress": list(n.progress) if n.progress else None,
                "error": n.error,
                "checkpoints": len(n.checkpoints),
                "steps": len(n.steps),
                "crashes": n.crashes,
                "waiting_for": n.waiting_for,
                "wake_at": n.wake_at.isoformat() if n.wake_at else None,
            }
            for name, n in run.nodes.items()
        },
    }

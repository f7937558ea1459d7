"""`ledgerflow workflows show RUN --outputs`: a run's node outputs, as its events recorded them."""

from __future__ import annotations

from typing import Any

from eventstore.spi import json_dumps
from ops.cli.common import console
from workflows import RunState


def node_outputs(run: RunState) -> dict[str, Any]:
    """Every node's output by name, in the run's order (None for a node without one yet)."""
    return {name: node.output for name, node in sorted(run.nodes.items(), key=lambda kv: kv[1].position)}


def print_outputs(run: RunState) -> None:
    """One line per node: its name, then its output as JSON (exact numbers kept), whole even when long."""
    console.print("[bold]outputs[/]")
    for name, output in node_outputs(run).items():
        text = "-" if output is None else json_dumps(output)
        # Printed as data, not markup: an output may hold brackets or rich's own markup.
        console.print(f"  {name}: ", end="", highlight=False)
        console.print(text, markup=False, highlight=False, soft_wrap=True)

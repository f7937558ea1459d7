"""How the CLI reports a bulk action: a progress line on stderr while it works, and its record once it
ended. The bulk commands and the retention pass (whose releases are bulk actions) both report this way."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from ops.cli.common import console, emit_json

if TYPE_CHECKING:
    from workflows import BulkAction


def print_progress(action: BulkAction) -> None:
    click.echo(
        f"{action.processed}/{action.matched} runs: {action.done} done, {action.failed} failed, "
        f"{action.skipped} skipped",
        err=True,
    )


def print_action(action: BulkAction, as_json: bool, exit_on_failure: bool = True) -> None:
    """The action's record (one JSON object with `as_json`); exit status 1 if it failed on any run, unless
    `exit_on_failure` is false."""
    if as_json:
        emit_json(dataclasses.asdict(action))
    else:
        console.print(
            f"bulk action {action.id} ({action.kind}, by {action.actor}): {action.state}; "
            f"{action.matched} matched, {action.done} done, {action.failed} failed, {action.skipped} skipped",
            highlight=False,
        )
        if action.last_error:
            console.print(f"last error: {action.last_error}", highlight=False)
        if action.state == "running":
            console.print(f"still running: see it with `ledgerflow workflows bulk show {action.id}`")
    if exit_on_failure and action.failed:
        raise SystemExit(1)

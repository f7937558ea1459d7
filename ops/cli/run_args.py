"""What the workflow commands read from their arguments and settings: the registry of workflows, a run
id, JSON input."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ops.settings import Settings
    from workflows import WorkflowRegistry


def registry_of(settings: Settings) -> WorkflowRegistry:
    from workflows import load_workflows

    return load_workflows(settings.workflow_paths)


def run_id_arg(text: str) -> uuid.UUID:
    from eventstore import InvalidInputError

    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidInputError(
            f"{text!r} is not a run id (a UUID); see `ledgerflow workflows list`"
        ) from None


def json_arg(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"--input takes JSON: {exc}") from None

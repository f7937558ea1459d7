"""What starts a workflow's runs besides a caller: events appended to the log (`Trigger`) and the ticks
of a clock (`Schedule`), as declared values checked when made. The workers that act on them are
`workflows.triggers` and `workflows.schedules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from croniter import croniter

from workflows.definition_checks import DefinitionError


@dataclass(frozen=True)
class Trigger:
    """Start one run of the workflow for every event of type `event_type` appended to the log (only in
    streams of `category`, the part of the stream id before its first `-`, when given). The run's input
    is the event (see `workflows.triggers.trigger_input`); it runs in the event's tenant."""

    event_type: str
    category: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.event_type, str) or not self.event_type.strip():
            raise DefinitionError(f"a trigger needs an event type, got {self.event_type!r}")
        if self.category is not None and (
            not isinstance(self.category, str) or not self.category or "-" in self.category
        ):
            raise DefinitionError(
                f"a trigger's category is a stream id's part before its first '-', got {self.category!r}"
            )


CatchUp = Literal["skip", "all"]


@dataclass(frozen=True)
class Schedule:
    """Start one run per tick of `cron` (UTC; five fields, or six with seconds last), across all workers.

    `catch_up` says what happens to ticks that passed while no worker ran: "skip" starts at most one run,
    for the latest of them; "all" starts one per missed tick, at most `max_catch_up` (the latest ones).
    Runs belong to `tenant` and get `{"tick": <ISO 8601 time of the tick>}` as their input."""

    cron: str
    catch_up: CatchUp = "skip"
    max_catch_up: int = 100
    tenant: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
            raise DefinitionError(f"invalid cron expression {self.cron!r}, e.g. '*/5 * * * *'")
        if self.catch_up not in ("skip", "all"):
            raise DefinitionError(f"catch_up must be 'skip' or 'all', got {self.catch_up!r}")
        if not isinstance(self.max_catch_up, int) or self.max_catch_up < 1:
            raise DefinitionError(f"max_catch_up must be at least 1, got {self.max_catch_up!r}")

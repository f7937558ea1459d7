"""Event types declared through the module-level decorators (in eventstore.DEFAULT_TYPES), as an
application declares them: named by LEDGERFLOW_EVENT_TYPES=tests.event_types for processes under test."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from eventstore import event_type, upcaster


@event_type("TestLineAdded", version=1)
class LineAddedV1(BaseModel):
    total: int


@event_type("TestLineAdded", version=2)
class LineAdded(BaseModel):
    amount_cents: int
    currency: str


@upcaster("TestLineAdded", 1, 2)
def _line_added_1_to_2(data: dict[str, Any]) -> dict[str, Any]:
    return {"amount_cents": data["total"] * 100, "currency": "EUR"}

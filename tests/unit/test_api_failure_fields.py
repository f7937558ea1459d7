"""The API's view of a projection failure (ops.api.failures.FailureOut) is projector's Failure record,
field for field and type for type, less what only the projector uses: a field added to the record
cannot be left out of the API unnoticed, nor one renamed on one side only."""

from __future__ import annotations

import typing

from ops.api.failures import FailureOut
from projector import Failure

#: The event's transaction id orders the log for the projector; the API identifies events by position.
ONLY_THE_PROJECTORS = {"event_tx"}


def test_the_api_failure_is_the_record_less_its_internals() -> None:
    record = [(name, hint) for name, hint in typing.get_type_hints(Failure).items()]
    api = [(name, field.annotation) for name, field in FailureOut.model_fields.items()]
    assert api == [(name, hint) for name, hint in record if name not in ONLY_THE_PROJECTORS]

"""Every error a workflow's code or its caller may meet can be imported from `workflows` itself."""

from __future__ import annotations

import inspect

import workflows
from eventstore import LedgerflowError
from workflows import errors, events


def test_every_public_workflow_error_is_exported() -> None:
    defined = {
        name
        for module in (errors, events)
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, LedgerflowError | BaseException)
        and value.__module__ == module.__name__
        and not name.startswith("_")
    }
    # The engine's own control flow, never raised to a node body or a caller: a node's suspension, and a
    # bulk action's page that must be taken one run at a time (workflows.bulk catches it).
    internal = {"NodeSuspended", "BatchUnfit"}
    assert defined - internal <= set(workflows.__all__), defined - internal - set(workflows.__all__)
    assert workflows.SignalTimeout is errors.SignalTimeout
    assert issubclass(workflows.SignalTimeout, TimeoutError)

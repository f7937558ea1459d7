"""The projector's typed errors and its boundary with the driver.

`wrap_exceptions()` is `eventstore.spi.wrap_exceptions` with the translations only the projector knows:
the unique index that admits one operator run per projection and scope, and the lock timeout a swap
sets so that it yields to readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventstore import ConflictError, spi

#: SQLSTATE of a lock not obtained within `lock_timeout`.
LOCK_NOT_AVAILABLE = "55P03"
ONE_OPERATOR_RUN = "projection_runs_one_operator_run"


class RunInProgressError(ConflictError):
    """A rebuild, replay or verify of the projection (in the same scope) is already running."""

    code = "run_in_progress"

    def __init__(self, projection: str | None, run_id: int | None, kind: str | None) -> None:
        self.projection, self.run_id, self.kind = projection, run_id, kind
        which = f"a {kind} (run {run_id})" if run_id is not None else "another rebuild, replay or verify"
        of = f" of {projection!r}" if projection else ""
        super().__init__(
            f"{which}{of} is already running; wait for it to finish "
            "(`ledgerflow projections runs` shows it), then ask again"
        )

    def details(self) -> dict[str, Any]:
        return {"projection": self.projection, "run_id": self.run_id, "kind": self.kind}


class TablesBusyError(ConflictError):
    """Readers held a projection's live tables longer than the swap waits for them."""

    code = "tables_busy"


@contextmanager
def wrap_exceptions() -> Iterator[None]:
    with spi.wrap_exceptions(
        {LOCK_NOT_AVAILABLE: lambda exc: TablesBusyError(f"the live tables are busy: {exc}")},
        constraints={ONE_OPERATOR_RUN: lambda exc: RunInProgressError(None, None, None)},
    ):
        yield

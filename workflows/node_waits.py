"""The durable waits of a node (`NodeContext.sleep`, `sleep_until`, `wait_for_signal`): a node that waits
holds no worker; its body runs again when the wait ends and gets the same answers from the log (see
`workflows.context`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from eventstore import ConflictError, InvalidInputError, WrongExpectedVersionError
from workflows import events as ev
from workflows import new_events as new
from workflows.errors import NodeSuspended, SignalTimeout
from workflows.node_context_base import TAKE_ATTEMPTS, NodeContextBase


class NodeContextWaits(NodeContextBase):
    """The durable waits of `NodeContext`, on the checks and fenced writes of its base."""

    # -- waiting ------------------------------------------------------------------------------------

    def _wait_key(self, kind: str, key: str | None) -> str:
        self._waits[kind] += 1
        return key if key is not None else f"{kind}#{self._waits[kind]}"

    def sleep(self, seconds: float, *, key: str | None = None) -> None:
        """Wait `seconds`, durably: the node lets go of its worker and wakes within about a second of the
        due time, on any worker. The due time is fixed when the body first reaches this call."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise InvalidInputError(f"sleep takes a finite number of seconds, got {seconds!r}")
        self._wait_until(self._wait_key("sleep", key), lambda: _now() + timedelta(seconds=max(seconds, 0)))

    def sleep_until(self, when: datetime, *, key: str | None = None) -> None:
        """Wait, durably, until `when` (a datetime with a time zone)."""
        if not isinstance(when, datetime) or when.utcoffset() is None:
            raise InvalidInputError(f"sleep_until takes a datetime with a time zone, got {when!r}")
        self._wait_until(self._wait_key("sleep", key), lambda: when)

    def _wait_until(self, key: str, due: Callable[[], datetime]) -> None:
        self.check()
        until = self._state.waits.get(key) or due()
        if _now() < until:
            raise NodeSuspended(key, until)

    def wait_for_signal(self, name: str, *, timeout: float | None = None, key: str | None = None) -> Any:
        """The payload of a signal `name` sent to the run, waiting durably for it if none is there yet.
        Each signal is taken by one wait: the earliest one no other wait took. With `timeout` (seconds,
        from when the body first reaches this call), raises SignalTimeout once it passes with no signal;
        the body, run again, gets the same answer (payload or timeout)."""
        ev.check_signal_name(name)  # a name no sender may use would be waited for forever
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
        ):
            raise InvalidInputError(f"timeout must be a number of seconds or None, got {timeout!r}")
        key = self._wait_key(f"signal:{name}", key)
        self.check()
        for _ in range(TAKE_ATTEMPTS):
            if key in self._state.taken:
                index = self._state.taken[key]
                if index is None:
                    raise SignalTimeout(f"no signal {name!r} came within the wait's timeout ({key})")
                return self._engine.signal_payload(self._run, index)
            index = self._run.untaken_signal(name)
            waits = self._state.waits
            until = (
                waits[key]
                if key in waits
                else None
                if timeout is None
                else _now() + timedelta(seconds=timeout)
            )
            if index is None and (until is None or _now() < until):
                raise NodeSuspended(key, until, name)
            taken = new.signal_taken(
                run_id=self.run_id, node=self.node, attempt=self.attempt, key=key, name=name, index=index
            )
            try:
                # At the version this node knows: a sibling wait that took the same signal first wins.
                self._write([taken], expected_version=self._run.version)
            except WrongExpectedVersionError:
                self._engine.catch_up(self._run)
                continue
            self._state.taken[key] = index
            if index is not None:
                self._run.signals_taken.add(index)
        raise ConflictError(f"run {self.run_id}: the run changed too often while taking signal {name!r}")


def _now() -> datetime:
    return datetime.now(UTC)

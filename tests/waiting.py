"""Waiting on a condition, never on a fixed sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy; return that, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def joined(*threads: threading.Thread, timeout: float = 60.0) -> None:
    """Join `threads`, all within `timeout` seconds; fail naming any still running (never wait for ever)."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise AssertionError(f"threads still running after {timeout}s: {alive}")

"""Waiting on a condition, never on a fixed sleep."""

from __future__ import annotations

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

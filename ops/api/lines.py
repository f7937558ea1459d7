"""Per-tenant admission: what each tenant holds, capped, and a bounded line of what waits for a slot.

The API admits two kinds of work per tenant this way: its requests in flight (`in_flight`: a cap of
LEDGERFLOW_MAX_REQUESTS_PER_TENANT, a line on the event loop) and its operator jobs (`jobs`: one running
per tenant, a queue served by the job threads in turn). Both keep the same books, here: a count per tenant
that never passes `limit`, and a first-come-first-served line per tenant that never grows past
`max_queued`. How a slot changes hands is the caller's: a request's slot goes straight to the next request
of its tenant (`release`), a job's slot waits for a free thread to take it (`take_next`).

No lock: the caller serialises every call (the event loop, or the job queue's condition).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class TenantLines(Generic[K, T]):
    """For each key (a tenant, or the server administrator's lane): how many slots it holds (at most
    `limit`) and the line of items waiting for one (at most `max_queued`)."""

    def __init__(self, limit: int, max_queued: int) -> None:
        self.limit, self.max_queued = limit, max_queued
        self._held: Counter[K] = Counter()
        self._lines: dict[K, deque[T]] = {}

    def held(self, key: K) -> int:
        return self._held[key]

    def waiting(self, key: K) -> int:
        return len(self._lines.get(key, ()))

    def anyone_waiting(self) -> bool:
        return bool(self._lines)

    def active(self) -> set[K]:
        """The keys that hold a slot or wait for one."""
        return set(self._held) | set(self._lines)

    def waiting_keys(self) -> list[K]:
        """The keys with a line, in the order their lines began."""
        return list(self._lines)

    def full(self, key: K) -> bool:
        """Whether `key`'s line has no room for one more."""
        return self.waiting(key) >= self.max_queued

    def take(self, key: K) -> bool:
        """Takes a slot for `key` at once if one is free and nobody of `key` waits for one (no
        overtaking its own line)."""
        if self._held[key] < self.limit and not self._lines.get(key):
            self._held[key] += 1
            return True
        return False

    def join(self, key: K, item: T) -> None:
        """Puts `item` at the end of `key`'s line (the caller has looked at `full`)."""
        self._lines.setdefault(key, deque()).append(item)

    def leave_line(self, key: K, item: T) -> None:
        """Takes `item` out of `key`'s line, if it is still in it (it gave up waiting)."""
        line = self._lines.get(key)
        if line is not None and item in line:
            line.remove(item)
            if not line:
                del self._lines[key]

    def take_next(self, key: K) -> T | None:
        """The first of `key`'s line, with a slot taken for it, if a slot is free; else None."""
        line = self._lines.get(key)
        if not line or self._held[key] >= self.limit:
            return None
        self._held[key] += 1
        item = line.popleft()
        if not line:
            del self._lines[key]
        return item

    def release(self, key: K, *, hand_to: Callable[[T], bool] | None = None) -> T | None:
        """One of `key`'s slots is given back. With `hand_to`, it goes instead to the first of `key`'s
        line that `hand_to` accepts (the count stays: the slot changes hands), and that item is returned;
        items it refuses (given up already) leave the line. A key that holds more than `limit` (the limit
        was lowered meanwhile) hands nothing over."""
        line = self._lines.get(key)
        while hand_to is not None and line and self._held[key] <= self.limit:
            item = line.popleft()
            if not line:
                del self._lines[key]
            if hand_to(item):
                return item
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]
        return None

    def hold_again(self, key: K) -> None:
        """Counts a slot of `key` again, past the cap if need be: for work that was admitted already and
        gave its slot back for a while (`release`)."""
        self._held[key] += 1

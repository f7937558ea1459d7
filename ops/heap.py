"""The cyclic collector's share of a long-running process's CPU, kept to what the process does.

A worker, projector or server holds some hundreds of thousands of objects made at start-up (modules,
classes, functions, pydantic and SQL caches) for as long as it runs. CPython's collector walks every one
of them again at each full collection, which the allocations of ordinary work keep triggering: work the
process does for nothing, on the same cores as its nodes and projections. Once started, a process moves
what it holds to the collector's permanent generation (`gc.freeze`): those objects are never walked
again, and are still freed as usual should their last reference go.
"""

from __future__ import annotations

import gc


def freeze_start_up_objects() -> None:
    """Collect once, then freeze what is left: call after start-up, before the process's main loop."""
    gc.collect()
    gc.freeze()

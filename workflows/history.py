"""A run's history, from its own stream: every event with its time, node, attempt, worker and a short
summary of its payload, a bounded page at a time.

Pages follow the stream's versions (keyset: the next page starts after the last version shown), so
reading a long run costs a page's worth each time, however deep. An event's attempt and worker are its
own when it names them, else those of its node's last claim seen so far on the page (a page that starts
mid-attempt leaves them out until the next claim, unless its reader passes the claims of the pages
before: the CLI and the console read page after page and do).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventstore import EventStore, InvalidInputError, NotFoundError, RecordedEvent
from eventstore.spi import check_tenant
from workflows import events as ev

#: The most events one page holds.
MAX_PAGE = 1000
#: A page stops once its events' payloads pass this many bytes (always with one event at least): the
#: summaries are short, but the payloads they are made from are read whole.
MAX_PAGE_BYTES = 1024 * 1024
_SUMMARY = 160


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    position: int
    at: datetime
    #: The event's type, without the `wf.` prefix of workflow events.
    type: str
    node: str | None
    attempt: int | None
    worker: str | None
    #: A short summary of the payload (at most 160 characters); payloads themselves stay in the log.
    summary: str
    actor: str | None = None


@dataclass(frozen=True)
class HistoryPage:
    run_id: uuid.UUID
    entries: list[HistoryEntry] = field(default_factory=list)
    #: The version to pass as `after` for the next page; None when this page reached the stream's end.
    next: int | None = None


def run_history(
    store: EventStore,
    run_id: uuid.UUID,
    *,
    tenant: str,
    after: int = 0,
    limit: int = 200,
    claims: dict[str, tuple[int, str]] | None = None,
) -> HistoryPage:
    """The run's events after stream version `after`, oldest first, at most `limit` of them. A run that
    does not exist in `tenant` is NotFoundError (another tenant's run as well). `claims`: each node's
    last claim (attempt, worker) seen on the pages before, kept up to date, for a reader of page after
    page (see `entries`)."""
    check_tenant(tenant)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be 1 to {MAX_PAGE}")
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise InvalidInputError("after must be a stream version, 0 or more")
    stream = ev.run_stream(run_id)
    page = store.read_stream_page(
        stream, tenant=tenant, from_version=after + 1, limit=limit, max_bytes=MAX_PAGE_BYTES
    )
    if not page.events and (after == 0 or store.stream_version(stream, tenant=tenant) is None):
        raise NotFoundError(
            f"no run {run_id} (tenant {tenant!r}); list runs with `ledgerflow workflows list`"
        )
    shown = [e.decode() for e in page.events]
    following = page.next_version - 1 if page.next_version is not None else None
    return HistoryPage(run_id, entries(shown, claims), following)


def entries(
    events: Sequence[RecordedEvent], claims: dict[str, tuple[int, str]] | None = None
) -> list[HistoryEntry]:
    """Each event as an entry, attempts and workers carried from each node's last claim among them (or
    in `claims`, the claims seen before them, which it keeps up to date)."""
    claims = claims if claims is not None else {}
    found: list[HistoryEntry] = []
    for e in events:
        data: dict[str, Any] = e.data if isinstance(e.data, dict) else {}
        node = data.get("node") if isinstance(data.get("node"), str) else None
        attempt = data.get("attempt") if isinstance(data.get("attempt"), int) else None
        worker = data.get("worker") if isinstance(data.get("worker"), str) else None
        if e.type == ev.NODE_CLAIMED and node is not None and attempt is not None and worker is not None:
            claims[node] = (attempt, worker)
        elif node is not None and node in claims:
            claimed_attempt, claimed_worker = claims[node]
            if attempt in (None, claimed_attempt):
                attempt, worker = claimed_attempt, worker or claimed_worker
        actor = data.get("actor") if isinstance(data.get("actor"), str) else None
        found.append(
            HistoryEntry(
                version=e.stream_version,
                position=e.position,
                at=e.recorded_at,
                type=e.type.removeprefix(ev.RESERVED_TYPE_PREFIX),
                node=node,
                attempt=attempt,
                worker=worker,
                summary=_cut(summary(e.type, data)),
                actor=actor,
            )
        )
    return found


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SUMMARY else text[: _SUMMARY - 1] + "…"


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:59] + "…"


_SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    ev.RUN_STARTED: lambda d: (
        f"{d.get('workflow')} v{d.get('version', 1)}"
        + (f", key {d['key']}" if d.get("key") else "")
        + (f", tags {_tags(d['tags'])}" if d.get("tags") else "")
        + (
            f", triggered by {d['triggered_by'].get('type')}"
            if isinstance(d.get("triggered_by"), dict)
            else ""
        )
    ),
    ev.NODES_READY: lambda d: "ready: " + ", ".join(map(str, d.get("nodes") or [])),
    ev.NODE_CLAIMED: lambda d: f"attempt {d.get('attempt')} on {d.get('worker')}",
    ev.NODE_PROGRESS: lambda d: (
        f"{d.get('current')}/{d.get('total') if d.get('total') is not None else '?'}"
        + (f" {d['message']}" if d.get("message") else "")
    ),
    ev.NODE_CHECKPOINT: lambda d: f"checkpoint {_short(d.get('item'))}",
    ev.STEP_RECORDED: lambda d: f"step {_short(d.get('key'))}",
    ev.CHILD_STARTED: lambda d: f"child {d.get('workflow') or ''} {d.get('child_run_id')}".replace("  ", " "),
    ev.NODE_SUCCEEDED: lambda d: (
        "succeeded"
        + (f" in {d['duration_ms']:.0f} ms" if isinstance(d.get("duration_ms"), int | float) else "")
    ),
    ev.NODE_RETRY_SCHEDULED: lambda d: f"retry in {d.get('retry_in')} s: {d.get('error')}",
    ev.NODE_FAILED: lambda d: f"failed: {d.get('error')}",
    ev.NODE_RECLAIMED: lambda d: f"reclaimed from {d.get('previous_worker')} ({d.get('reason')})",
    ev.NODE_RELEASED: lambda d: f"handed back by {d.get('worker')}",
    ev.NODE_STUCK: lambda d: f"stuck after {d.get('seconds')} s, {d.get('action')}",
    ev.NODE_PARKED: lambda d: f"parked: {d.get('error')}",
    ev.NODE_CANCELLED: lambda d: "cancelled",
    ev.NODE_WAITING: lambda d: (
        (f"waits for signal {d['signal']}" if d.get("signal") else "timer")
        + (f" until {d['until']}" if d.get("until") else "")
    ),
    ev.SIGNAL_RECEIVED: lambda d: f"signal {d.get('name')}",
    ev.SIGNAL_TAKEN: lambda d: (
        f"took signal {d.get('name')}" + (" (timed out)" if d.get("index") is None else f" #{d.get('index')}")
    ),
    ev.RUN_TAGGED: lambda d: "tags " + _tags(d.get("tags") or {}),
    ev.RUN_CANCEL_REQUESTED: lambda d: "cancel requested",
    ev.RUN_RETRIED: lambda d: "retry: " + ", ".join(map(str, d.get("nodes") or [])),
    ev.RUN_REFRESHED: lambda d: "refresh: " + ", ".join(map(str, d.get("nodes") or [])),
    ev.RUN_COMPLETED: lambda d: "succeeded",
    ev.RUN_FAILED: lambda d: f"failed: {d.get('error')}",
    ev.RUN_CANCELLED: lambda d: "cancelled",
    ev.RUN_CONTINUED_AS_NEW: lambda d: f"continued as {d.get('successor_run_id')}",
    ev.RUN_RELEASED: lambda d: f"released by retention ({d.get('actor')})",
    ev.RUN_RESTORED: lambda d: f"restored ({d.get('actor')})",
}


def _tags(tags: Any) -> str:
    if not isinstance(tags, dict):
        return "?"
    return " ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in tags.items())


def summary(event_type: str, data: dict[str, Any]) -> str:
    """A line about an event's payload: what an operator reads in a timeline."""
    describe = _SUMMARIES.get(event_type)
    if describe is None:
        return ", ".join(sorted(data)) if data else ""
    try:
        return describe(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return ", ".join(sorted(data))

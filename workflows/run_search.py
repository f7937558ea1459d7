"""Finding runs: by workflow, version, status, tags, start and end time, parent run and triggering event,
a page at a time, from the run tables (the `workflow_tables` projection, which trails the log by the
projector's lag).

Pages are newest first and continue by keyset, never OFFSET: a page's `next` is an opaque cursor naming
the last run it holds (its start time and id) and the search it belongs to; the next page starts below
it, so a page deep in the results costs what the first one does, and runs started meanwhile do not shift
the pages. A cursor given to another search (other filters, another tenant; time bounds may move) is
refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from eventstore import EventStore, InvalidInputError, MissingRelationError
from eventstore.spi import check_tenant, load_queries
from workflows.errors import wrap_exceptions
from workflows.tags import TagLimits, parse_tag

Q = load_queries("workflows", "run_search.sql")

#: The most runs one page holds.
MAX_PAGE = 500
STATUSES = frozenset({"running", "paused", "succeeded", "failed", "cancelled", "continued"})
_TAGS = TagLimits()


@dataclass(frozen=True)
class RunFilter:
    """What a search keeps: every field that is set must hold (tags: every pair)."""

    workflow: str | None = None
    #: The workflow definition's version the run started with.
    version: str | None = None
    #: Any of these statuses (empty: any status).
    statuses: tuple[str, ...] = ()
    #: (key, value) pairs the run carries, all of them.
    tags: tuple[tuple[str, str], ...] = ()
    #: Started at or after / before (exclusive) these times.
    started_after: datetime | None = None
    started_before: datetime | None = None
    #: Ended at or after / before (exclusive) these times (a run still going never matches).
    ended_after: datetime | None = None
    ended_before: datetime | None = None
    #: Children started by this run (`ctx.start_workflow`).
    parent: uuid.UUID | None = None
    #: Started by the log event with this id (a trigger).
    triggered_by: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.statuses) - STATUSES
        if unknown:
            raise InvalidInputError(
                f"unknown run status {sorted(unknown)}: use {', '.join(sorted(STATUSES))}"
            )
        for key, value in self.tags:
            _TAGS.check({key: value})
        for name in ("started_after", "started_before", "ended_after", "ended_before"):
            when = getattr(self, name)
            if when is not None and when.utcoffset() is None:
                raise InvalidInputError(f"{name} needs a time zone, e.g. 2026-01-31T12:00:00+00:00")


@dataclass(frozen=True)
class RunPage:
    #: The runs, newest first: the run table's columns, `tags` a dict, `triggered_by` an event id.
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: Pass as `after` for the next page; None on the last page.
    next: str | None = None


def search_runs(
    store: EventStore,
    *,
    tenant: str,
    filter: RunFilter | None = None,
    limit: int = 50,
    after: str | None = None,
) -> RunPage:
    """A page of the tenant's runs that `filter` keeps, newest first, after the cursor `after` (the
    `next` of the page before). Before a projector has created the run tables there are no runs."""
    check_tenant(tenant)
    wanted = filter if filter is not None else RunFilter()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be 1 to {MAX_PAGE}")
    digest = _digest(tenant, wanted)
    query, params = _query(tenant, wanted, limit + 1, _decode(after, digest) if after else None)
    try:
        with wrap_exceptions(), store.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(query, params).fetchall()
    except MissingRelationError:
        return RunPage()  # no projector has created the tables yet: no runs to show
    if len(rows) <= limit:
        return RunPage(rows)
    last = rows[limit - 1]
    return RunPage(rows[:limit], _encode(last["created_at"], last["run_id"], digest))


def _query(
    tenant: str, wanted: RunFilter, limit: int, after: tuple[datetime, uuid.UUID] | None
) -> tuple[sql.Composed, dict[str, Any]]:
    params: dict[str, Any] = {"tenant": tenant, "limit": limit}
    tags = list(dict.fromkeys(wanted.tags))
    by_tag = bool(tags)
    parts = [Q["columns"], Q["from_tag"] if by_tag else Q["from_runs"]]
    if by_tag:
        (params["tag_key"], params["tag_value"]), more = tags[0], tags[1:]
        if more:
            parts.append(Q["more_tags"])
            params["more_keys"], params["more_values"] = [k for k, _ in more], [v for _, v in more]
            params["more_count"] = len(more)
    for name, value in (
        ("workflow", wanted.workflow),
        ("version", wanted.version),
        ("statuses", sorted(wanted.statuses) or None),
        ("started_after", wanted.started_after),
        ("started_before", wanted.started_before),
        ("ended_after", wanted.ended_after),
        ("ended_before", wanted.ended_before),
        ("parent", wanted.parent),
        ("triggered_by", wanted.triggered_by),
    ):
        if value is not None:
            parts.append(Q[name])
            params[name] = value
    if after is not None:
        parts.append(Q["page_tag"] if by_tag else Q["page_runs"])
        params["after_at"], params["after_run"] = after
    parts.append(Q["order_tag"] if by_tag else Q["order_runs"])
    return sql.SQL("\n").join(sql.SQL(p) for p in parts), params


# -- cursors ---------------------------------------------------------------------------------------------


def _digest(tenant: str, wanted: RunFilter) -> str:
    """What a cursor remembers of its search: a page may only continue the search it came from. Its time
    bounds are left out: the next page of "started in the last hour" may be asked a minute later (the
    keyset continues below the cursor all the same)."""
    described = {**asdict(wanted), "tenant": tenant}
    for bound in ("started_after", "started_before", "ended_after", "ended_before"):
        described.pop(bound)
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _encode(created_at: datetime, run_id: uuid.UUID, digest: str) -> str:
    text = json.dumps([created_at.isoformat(), str(run_id), digest], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode(cursor: str, digest: str) -> tuple[datetime, uuid.UUID]:
    try:
        if not isinstance(cursor, str) or len(cursor) > 200:
            raise ValueError("too long")
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, run_id, made_for = json.loads(text)
        position = (datetime.fromisoformat(at), uuid.UUID(run_id))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInputError(
            "invalid page cursor: pass the `next` of the previous page unchanged"
        ) from exc
    if made_for != digest:
        raise InvalidInputError(
            "this page cursor belongs to another search: repeat the search with the filters of the page "
            "that gave it, or start again without a cursor"
        )
    return position


def tag_filter(texts: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`KEY=VALUE` texts (the CLI's and the API's `tag`) as a RunFilter's tags."""
    return tuple(parse_tag(t) for t in texts)


def cursor_at(tenant: str, filter: RunFilter, created_at: datetime, run_id: uuid.UUID) -> str:
    """The page cursor of `filter`'s search that continues right below the run (`created_at`, `run_id`):
    how a resumed walk over the results (a bulk action) picks up where it stopped."""
    return _encode(created_at, run_id, _digest(tenant, filter))

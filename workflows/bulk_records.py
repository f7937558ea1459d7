"""A bulk action's record: a row of ledgerflow.bulk_actions (who, when, the filter, the tenant, the kind,
how many runs matched, its counts and the keyset position of the last run it processed), its dry run,
and its filter as the record keeps it. Apart from working the action (`workflows.bulk`), which only
advances the record.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

import structlog
from psycopg.types.json import Jsonb

from eventstore import (
    EventStore,
    InvalidInputError,
    NotFoundError,
)
from eventstore.spi import check_tenant, fetch_all, fetch_one, load_queries
from workflows.bulk_kinds import KINDS
from workflows.errors import wrap_exceptions
from workflows.run_search import MAX_PAGE, RunFilter, search_runs

log = structlog.get_logger("workflows.bulk")

Q = load_queries("workflows", "bulk.sql")

#: The most runs one action takes unless the caller (the `bulk_max_runs` setting) says otherwise.
MAX_BULK_RUNS = 10_000


class BulkLimitError(InvalidInputError):
    """More runs match than one bulk action may take; nothing was recorded. The HTTP API answers 422."""

    code = "bulk_limit"

    def __init__(self, matched: int, limit: int) -> None:
        self.matched, self.limit = matched, limit
        super().__init__(
            f"more than {limit} runs match (at least {matched}); one bulk action takes at most {limit} "
            "(setting LEDGERFLOW_BULK_MAX_RUNS): narrow the filter, e.g. by start time, and act in parts"
        )

    def details(self) -> dict[str, Any]:
        return {"matched_at_least": self.matched, "limit": self.limit, "setting": "LEDGERFLOW_BULK_MAX_RUNS"}


@dataclass(frozen=True)
class BulkAction:
    """A bulk action's record and progress (a row of ledgerflow.bulk_actions)."""

    id: uuid.UUID
    tenant: str
    kind: str
    actor: str
    #: The filter as JSON (`filter_to_json`).
    filter: dict[str, Any]
    #: running, completed or failed.
    state: str
    matched: int
    max_runs: int
    done: int
    failed: int
    skipped: int
    last_run_id: uuid.UUID | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None

    @property
    def processed(self) -> int:
        return self.done + self.failed + self.skipped


@dataclass(frozen=True)
class BulkPlan:
    """What a dry run answers: how many runs an action with this filter would touch."""

    kind: str
    tenant: str
    matched: int
    #: The most one action takes; `matched` stops counting one past it.
    limit: int

    @property
    def over_limit(self) -> bool:
        return self.matched > self.limit


def filter_to_json(wanted: RunFilter) -> dict[str, Any]:
    """The filter as JSON (times in ISO 8601, ids as text), as the action's record keeps it."""
    value: dict[str, Any] = json.loads(json.dumps(asdict(wanted), default=str))
    return value


def filter_from_json(value: Mapping[str, Any]) -> RunFilter:
    known = {f.name for f in fields(RunFilter)}
    unknown = set(value) - known
    if unknown:
        raise InvalidInputError(f"unknown filter fields {sorted(unknown)}: use {', '.join(sorted(known))}")
    given: dict[str, Any] = dict(value)
    try:
        for name in ("started_after", "started_before", "ended_after", "ended_before"):
            if given.get(name) is not None:
                given[name] = datetime.fromisoformat(given[name])
        if given.get("parent") is not None:
            given["parent"] = uuid.UUID(str(given["parent"]))
        given["statuses"] = tuple(given.get("statuses") or ())
        given["tags"] = tuple((str(k), str(v)) for k, v in given.get("tags") or ())
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"invalid bulk filter: {exc}") from exc
    return RunFilter(**given)


def plan_bulk(
    store: EventStore, *, kind: str, tenant: str, filter: RunFilter, limit: int = MAX_BULK_RUNS
) -> BulkPlan:
    """A dry run: how many of the tenant's runs `filter` keeps (counted up to one past `limit`)."""
    _check(kind, tenant, limit)
    matched, _ = _count(store, tenant, filter, limit)
    return BulkPlan(kind, tenant, matched, limit)


def create_bulk_action(
    store: EventStore,
    *,
    kind: str,
    tenant: str,
    filter: RunFilter,
    actor: str,
    limit: int = MAX_BULK_RUNS,
    cap: bool = False,
) -> BulkAction:
    """Record an action over the runs `filter` keeps now; `run_bulk_action` works it. More than `limit`
    matching runs raise BulkLimitError and record nothing, unless `cap`: then the action takes the newest
    `limit` of them (a retention pass leaves the rest to the next)."""
    _check(kind, tenant, limit)
    matched, top = _count(store, tenant, filter, limit)
    if matched > limit:
        if not cap:
            raise BulkLimitError(matched, limit)
        matched = limit
    params = {
        "id": uuid.uuid4(),
        "tenant": tenant,
        "kind": kind,
        "actor": actor,
        "filter": Jsonb(filter_to_json(filter)),
        "matched": matched,
        "max_runs": limit,
        "top_created_at": top[0] if top else None,
        "top_run_id": top[1] if top else None,
    }
    with wrap_exceptions(), store.pool.connection() as conn:
        row = fetch_one(conn, action_row, Q["insert"], params)
    assert row is not None
    action = row.action
    log.info("bulk_action_recorded", bulk_id=str(action.id), kind=kind, tenant=tenant, matched=matched)
    return action


def bulk_action(store: EventStore, action_id: uuid.UUID, *, tenant: str) -> BulkAction:
    """An action's record and progress; another tenant's action is not found."""
    return read_action_row(store, action_id, tenant).action


def unfinished_bulk_actions(store: EventStore, *, idle_seconds: float, limit: int = 100) -> list[BulkAction]:
    """Running actions of every tenant that nothing has advanced for `idle_seconds` (a server administrator's
    view, for the process that resumes them): oldest first, at most `limit`."""
    params = {"idle_seconds": idle_seconds, "limit": limit}
    with wrap_exceptions(), store.pool.connection() as conn:
        return [row.action for row in fetch_all(conn, action_row, Q["unfinished"], params)]


def _count(
    store: EventStore, tenant: str, wanted: RunFilter, limit: int
) -> tuple[int, tuple[datetime, uuid.UUID] | None]:
    """How many runs `wanted` keeps, counted up to one past `limit`, and the newest of them."""
    matched, top, after = 0, None, None
    while matched <= limit:
        page = search_runs(store, tenant=tenant, filter=wanted, limit=MAX_PAGE, after=after)
        if top is None and page.runs:
            top = (page.runs[0]["created_at"], page.runs[0]["run_id"])
        matched += len(page.runs)
        if page.next is None:
            break
        after = page.next
    return min(matched, limit + 1), top


def _check(kind: str, tenant: str, limit: int) -> None:
    check_tenant(tenant)
    if kind not in KINDS:
        raise InvalidInputError(f"unknown bulk action {kind!r}: use {', '.join(sorted(KINDS))}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError("a bulk action's limit is a count of at least 1")


def read_action_row(store: EventStore, action_id: uuid.UUID, tenant: str) -> ActionRow:
    check_tenant(tenant)
    with wrap_exceptions(), store.pool.connection() as conn:
        row = fetch_one(conn, action_row, Q["get"], {"id": action_id, "tenant": tenant})
    if row is None:
        raise NotFoundError(
            f"no bulk action {action_id} for tenant {tenant!r}; an action is read by the tenant that made it"
        )
    return row


@dataclass(frozen=True, slots=True)
class ActionRow:
    """A row of ledgerflow.bulk_actions: the action's record, and where its work stands (the newest run it
    may act on, and the creation time of the last run it counted, with `action.last_run_id`)."""

    action: BulkAction
    top_created_at: datetime | None
    top_run_id: uuid.UUID | None
    last_created_at: datetime | None


def action_row(
    *,
    top_created_at: datetime | None,
    top_run_id: uuid.UUID | None,
    last_created_at: datetime | None,
    **columns: Any,
) -> ActionRow:
    """Each of the table's other columns is a field of `BulkAction`: a column added without one fails here."""
    return ActionRow(BulkAction(**columns), top_created_at, top_run_id, last_created_at)

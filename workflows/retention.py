"""The retention pass: release a tenant's ended runs that are older than their workflow's retention.

A pass is recorded as bulk actions of kind `release` (workflows.bulk, ledgerflow.bulk_actions): one per
workflow with due runs, each of at most LEDGERFLOW_RETENTION_BATCH runs (the rest wait for the next pass),
with who, when, the filter, progress and counts. A pass first finishes the release actions a crashed pass
left running; each run is released under an idempotency key of the action and the run, so never twice.
Whether a run is due is decided again, from its own stream, when it is released (workflows.releases): the
tables only preselect.

What one run's release means, and how it is restored: workflows.releases.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog

from eventstore import EventStore, MissingRelationError
from eventstore.spi import check_tenant, fetch_values, load_queries
from workflows import bulk, bulk_records
from workflows.engine import Engine
from workflows.errors import wrap_exceptions
from workflows.releases import RetentionSettings, retention_of
from workflows.run_search import RunFilter
from workflows.run_state import TERMINAL_RUN

log = structlog.get_logger("workflows.retention")
Q = load_queries("workflows", "retention.sql")

ENDED = tuple(sorted(TERMINAL_RUN))


@dataclass(frozen=True)
class RetentionPlan:
    """What a pass would release for one workflow of a tenant: its retention and how many runs are due
    (counted up to one past `limit`: one pass takes at most `limit` of them)."""

    workflow: str
    retention: timedelta
    due: int
    limit: int


def plan_retention(
    engine: Engine, *, tenant: str = "default", settings: RetentionSettings | None = None
) -> list[RetentionPlan]:
    """A dry run: for each workflow of the tenant's ended runs that has a retention, how many are due."""
    settings = settings if settings is not None else RetentionSettings()
    limit = settings.retention_batch
    plans = []
    for workflow, retention, wanted in _filters(engine, tenant, settings.run_retention):
        plan = bulk_records.plan_bulk(engine.store, kind="release", tenant=tenant, filter=wanted, limit=limit)
        plans.append(RetentionPlan(workflow, retention, plan.matched, limit))
    return plans


def retention_pass(
    engine: Engine,
    *,
    tenant: str = "default",
    actor: str = "retention",
    settings: RetentionSettings | None = None,
    progress: Callable[[bulk_records.BulkAction], None] | None = None,
    started_before: Mapping[str, datetime] | None = None,
) -> list[bulk_records.BulkAction]:
    """Release the tenant's due runs: first the release actions a crashed pass left running, then one new
    action per workflow with due runs (with `started_before`, of that workflow's runs started before its
    entry there: where an earlier pass got to, while the run tables still show the runs it released).
    Returns the actions worked (their records and counts)."""
    check_tenant(tenant)
    settings = settings if settings is not None else RetentionSettings()
    worked = [
        bulk.run_bulk_action(engine, action_id, tenant=tenant, progress=progress)
        for action_id in _unfinished(engine.store, tenant)
    ]
    for workflow, _retention, wanted in _filters(engine, tenant, settings.run_retention):
        if started_before is not None and workflow in started_before:
            wanted = dataclasses.replace(wanted, started_before=started_before[workflow])
        plan = bulk_records.plan_bulk(
            engine.store, kind="release", tenant=tenant, filter=wanted, limit=settings.retention_batch
        )
        if plan.matched == 0:
            continue
        action = bulk_records.create_bulk_action(
            engine.store,
            kind="release",
            tenant=tenant,
            filter=wanted,
            actor=actor,
            limit=settings.retention_batch,
            cap=True,
        )
        log.info("retention_action_recorded", workflow=workflow, tenant=tenant, due=action.matched)
        worked.append(bulk.run_bulk_action(engine, action.id, tenant=tenant, progress=progress))
    return worked


def reached(store: EventStore, actions: Sequence[bulk_records.BulkAction]) -> dict[str, datetime]:
    """Per workflow, the start time of the oldest run these release actions processed: a next pass over
    runs started before it meets none of theirs again."""
    ids = [a.id for a in actions]
    with wrap_exceptions(), store.pool.connection() as conn:
        rows = conn.execute(Q["reached"], {"ids": ids}).fetchall()
    out: dict[str, datetime] = {}
    for workflow, at in rows:
        out[workflow] = min(at, out.get(workflow, at))
    return out


def _filters(
    engine: Engine, tenant: str, default: timedelta | None
) -> list[tuple[str, timedelta, RunFilter]]:
    """(workflow, retention, the filter of its due runs) for each workflow of the tenant's ended runs."""
    check_tenant(tenant)
    now = datetime.now(UTC)
    out: list[tuple[str, timedelta, RunFilter]] = []
    for workflow in _workflows(engine.store, tenant):
        retention = retention_of(engine, workflow, default)
        if retention is not None:
            wanted = RunFilter(workflow=workflow, statuses=ENDED, ended_before=now - retention)
            out.append((workflow, retention, wanted))
    return out


def _workflows(store: EventStore, tenant: str) -> Sequence[str]:
    """The workflows of the tenant's ended runs (none before a projector has created the run tables)."""
    try:
        with wrap_exceptions(), store.pool.connection() as conn:
            return fetch_values(conn, Q["workflows"], {"tenant": tenant})
    except MissingRelationError:
        return []


def _unfinished(store: EventStore, tenant: str) -> list[uuid.UUID]:
    with wrap_exceptions(), store.pool.connection() as conn:
        return fetch_values(conn, Q["unfinished"], {"tenant": tenant})

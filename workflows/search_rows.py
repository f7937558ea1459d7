"""What the `workflow_tables` projection keeps so that runs can be searched (`workflows.run_search`):
the run table's indexes, one row per tag of a run (`workflow_run_tags`), and each child run's parent.

Tags are the fold's (`RunState.tags`: RunStarted's, then RunTagged's changes), written whenever a batch
changed a run's tags; the tag rows carry the run's tenant and start time, so that a search by tag walks
one index in the order of its pages (newest first) and stops at a page's end. A child's parent comes from
the ChildStarted event in the parent's stream: the child's own start commits before it, so its row is
there when the link is written (in the same batch at the latest, whose upsert runs first). Everything here
comes from the events, so a rebuild writes the same rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import LiteralString

from projector import ApplyContext
from workflows import node_event_models as nem
from workflows import release_marks
from workflows.run_state import RunState

# Every list and search orders by (created_at, run_id), newest first, and pages by keyset on that pair:
# each filter that can drive a search has an index in that order behind its equality columns (ascending,
# read backwards: a row comparison `(created_at, run_id) < (...)` is an index condition on them).
RUN_INDEXES: LiteralString = """
CREATE INDEX workflow_runs_by_status ON {table} (tenant, status, created_at, run_id);
CREATE INDEX workflow_runs_by_start ON {table} (tenant, created_at, run_id);
CREATE INDEX workflow_runs_by_workflow ON {table} (tenant, workflow, created_at, run_id);
CREATE INDEX workflow_runs_by_end ON {table} (tenant, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX workflow_runs_by_parent ON {table} (parent_run_id, created_at, run_id)
       WHERE parent_run_id IS NOT NULL;
CREATE INDEX workflow_runs_by_trigger ON {table} (tenant, (triggered_by->>'event_id'))
       WHERE triggered_by IS NOT NULL
"""

TAGS_DDL: LiteralString = """
CREATE TABLE {table} (
    tenant      text        NOT NULL,
    key         text        NOT NULL,
    value       text        NOT NULL,
    run_id      uuid        NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX workflow_run_tags_by_value ON {table} (tenant, key, value, created_at, run_id)
"""

_DELETE_TAGS: LiteralString = "DELETE FROM {workflow_run_tags} WHERE run_id = ANY(%s::uuid[])"
_INSERT_TAGS: LiteralString = """
INSERT INTO {workflow_run_tags} (tenant, key, value, run_id, created_at)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::uuid[], %s::timestamptz[])
"""
# A child run of another tenant is never linked: a run starts children in its own tenant only.
_LINK_CHILDREN: LiteralString = """
UPDATE {workflow_runs} r
   SET parent_run_id = l.parent
  FROM unnest(%s::text[], %s::uuid[], %s::uuid[]) AS l(tenant, child, parent)
 WHERE r.run_id = l.child AND r.tenant = l.tenant AND r.parent_run_id IS DISTINCT FROM l.parent
"""


def keep_tags(ctx: ApplyContext, runs: Sequence[RunState]) -> None:
    """Replace the tag rows of `runs` (whose tags the batch changed) by their current tags."""
    if not runs:
        return
    ctx.execute(_DELETE_TAGS, [[run.run_id for run in runs]])
    rows = [
        (run.tenant, key, value, run.run_id, run.started_at)
        for run in runs
        if run.started_at is not None
        for key, value in sorted(run.tags.items())
    ]
    if rows:
        ctx.execute(_INSERT_TAGS, [list(c) for c in zip(*rows, strict=True)])


def link_children(ctx: ApplyContext, started: Sequence[tuple[str, nem.ChildStarted]]) -> None:
    """Record each started child's parent run (`(tenant, ChildStarted)` pairs, in log order)."""
    links: dict[tuple[str, uuid.UUID], uuid.UUID] = {}
    for tenant, e in started:
        try:
            child = uuid.UUID(e.child_run_id)
        except ValueError:
            continue  # not a run id: no run to link
        links[(tenant, child)] = e.run_id
    if links:
        tenants, children = zip(*links, strict=True)
        ctx.execute(_LINK_CHILDREN, [list(tenants), list(children), list(links.values())])


def link_restored(ctx: ApplyContext, restored: Sequence[tuple[str, uuid.UUID]]) -> None:
    """Link each restored run to its parent again, as its start names it (a child run started before its
    start named its parent stays without one, as after a rebuild)."""
    links: list[tuple[str, uuid.UUID, uuid.UUID]] = []
    for tenant, run_id in restored:
        parent = release_marks.parent_of(ctx.conn, run_id, tenant)
        if parent is not None:
            links.append((tenant, run_id, parent))
    if links:
        ctx.execute(_LINK_CHILDREN, [list(c) for c in zip(*links, strict=True)])

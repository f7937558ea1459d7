-- Limits per key (migrations/0015_workflow_limits.sql): what workers declare, and what operators see.

-- name: declared_limits
-- The limits as declared so far, locked until the declaration commits: two workers starting at once
-- declare one after the other, and each compares its own with what the other wrote.
SELECT name, concurrency, per_minute, declared_by
  FROM ledgerflow.workflow_limits
 WHERE name = ANY (%(names)s::text[])
 ORDER BY name
   FOR UPDATE

-- name: declare_limits
-- The last worker to start wins: its registry's bounds are the ones every claim enforces from now on.
INSERT INTO ledgerflow.workflow_limits AS l (name, concurrency, per_minute, declared_by)
SELECT u.name, u.concurrency, u.per_minute, %(worker)s
  FROM unnest(%(names)s::text[], %(concurrency)s::int[], %(per_minute)s::int[]) AS u(name, concurrency, per_minute)
    ON CONFLICT (name) DO UPDATE
   SET concurrency = excluded.concurrency, per_minute = excluded.per_minute,
       declared_by = excluded.declared_by, declared_at = clock_timestamp()

-- name: declare_node_limits
-- Each node's limits, one comma-separated list per node (limit names never hold a comma); the nodes of
-- these workflows that need no limit any more lose their row.
WITH declared AS (
    SELECT u.workflow, u.node, string_to_array(u.limits, ',') AS limits
      FROM unnest(%(workflows)s::text[], %(nodes)s::text[], %(limits)s::text[]) AS u(workflow, node, limits)
), forgotten AS (
    DELETE FROM ledgerflow.workflow_node_limits nl
     WHERE nl.workflow = ANY (%(all_workflows)s::text[])
       AND NOT EXISTS (SELECT FROM declared d WHERE d.workflow = nl.workflow AND d.node = nl.node)
)
INSERT INTO ledgerflow.workflow_node_limits AS nl (workflow, node, limits)
SELECT workflow, node, limits FROM declared
    ON CONFLICT (workflow, node) DO UPDATE SET limits = excluded.limits
 WHERE nl.limits IS DISTINCT FROM excluded.limits

-- name: holds_claim
-- Whether this claim holds its node now: false for a successor handed over without a slot (see
-- ledgerflow.wf_end_node in migrations/0015_workflow_limits.sql).
SELECT EXISTS (SELECT FROM ledgerflow.workflow_queue
                WHERE run_id = %(run_id)s AND node = %(node)s AND token = %(token)s AND status = 'claimed')

-- name: usage
-- Every declared limit with its slots in use (nodes running, steps holding one), its nodes ready and
-- waiting to start, and its starts in the last minute.
WITH per_limit AS (
    SELECT k.name,
           count(*) FILTER (WHERE q.status = 'ready') AS waiting
      FROM ledgerflow.workflow_node_limits nl
     CROSS JOIN LATERAL unnest(nl.limits) AS k(name)
      JOIN ledgerflow.workflow_queue q ON q.workflow = nl.workflow AND q.node = nl.node
     GROUP BY k.name
)
SELECT l.name, l.concurrency, l.per_minute, ledgerflow.wf_limit_in_use(l.name) AS in_use,
       coalesce(p.waiting, 0)::int AS waiting,
       (SELECT count(*) FROM ledgerflow.workflow_limit_starts s
         WHERE s.name = l.name AND s.started_at > clock_timestamp() - interval '1 minute')::int AS started_last_minute,
       l.declared_by, l.declared_at
  FROM ledgerflow.workflow_limits l
  LEFT JOIN per_limit p ON p.name = l.name
 ORDER BY l.name

-- name: hold_slots
-- A step's slots, under its node's claim (see ledgerflow.wf_limits_hold, migrations/0018).
SELECT admitted, wake_at FROM ledgerflow.wf_limits_hold(%(run_id)s, %(node)s, %(token)s, %(keys)s::text[])

-- name: release_slots
DELETE FROM ledgerflow.workflow_limit_holds
 WHERE run_id = %(run_id)s AND node = %(node)s AND token = %(token)s AND name = ANY (%(keys)s::text[])

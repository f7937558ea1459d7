-- The retention pass (workflows.retention).

-- name: workflows
-- The workflows of a tenant's ended runs: a skip scan over the index by workflow (one probe per workflow,
-- not one row per run), so that a pass over millions of runs starts at once.
WITH RECURSIVE w(workflow) AS (
    (SELECT workflow FROM ledgerflow.workflow_runs WHERE tenant = %(tenant)s ORDER BY workflow LIMIT 1)
    UNION ALL
    SELECT (SELECT r.workflow FROM ledgerflow.workflow_runs r
             WHERE r.tenant = %(tenant)s AND r.workflow > w.workflow ORDER BY r.workflow LIMIT 1)
      FROM w WHERE w.workflow IS NOT NULL
)
SELECT workflow FROM w WHERE workflow IS NOT NULL

-- name: unfinished
-- Release actions a crashed pass left running, oldest first.
SELECT id FROM ledgerflow.bulk_actions
 WHERE tenant = %(tenant)s AND kind = 'release' AND state = 'running'
 ORDER BY created_at

-- name: try_pass_lock
-- One retention pass at a time across every process (workflows.retention_worker): a session lock, which a
-- killed process's connection drops with it, so the next tick anywhere takes over without waiting.
SELECT pg_try_advisory_lock(hashtextextended('ledgerflow.retention_pass', 0))

-- name: pass_unlock
SELECT pg_advisory_unlock(hashtextextended('ledgerflow.retention_pass', 0))

-- name: tenants
-- The tenants with ended runs: a skip scan over the index by end (one probe per tenant).
WITH RECURSIVE t(tenant) AS (
    (SELECT tenant FROM ledgerflow.workflow_runs WHERE finished_at IS NOT NULL ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant FROM ledgerflow.workflow_runs r
             WHERE r.finished_at IS NOT NULL AND r.tenant > t.tenant ORDER BY r.tenant LIMIT 1)
      FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL

-- name: reached
-- Where release actions got to: each one's workflow and the start time of the last run it processed
-- (actions walk their runs newest first).
SELECT filter ->> 'workflow', last_created_at
  FROM ledgerflow.bulk_actions
 WHERE id = ANY(%(ids)s::uuid[]) AND last_created_at IS NOT NULL AND filter ->> 'workflow' IS NOT NULL

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

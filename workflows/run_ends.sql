-- A run's end as the run table shows it (workflows.run_ends): one query for every run some request waits
-- for. The waited runs join the table by its primary key, each in its own tenant.

-- name: ended_runs
SELECT r.tenant, r.run_id, r.updated_at
  FROM unnest(%(tenants)s::text[], %(run_ids)s::uuid[]) AS w(tenant, run_id)
  JOIN ledgerflow.workflow_runs r ON r.run_id = w.run_id AND r.tenant = w.tenant
 WHERE r.status = ANY(%(ended)s::text[])

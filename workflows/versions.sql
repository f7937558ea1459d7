-- Which workflow versions live worker processes have (workflows/versions.py; table: migration 0016).

-- name: forget_departed_versions
-- Rows of processes whose presence is gone (their session closed) or was never trusted.
DELETE FROM ledgerflow.workflow_worker_versions v
 WHERE v.instance <> %(instance)s
   AND NOT EXISTS (SELECT FROM ledgerflow.wf_worker_presence() p WHERE p.instance = v.instance AND p.alive)

-- name: advertise_versions
INSERT INTO ledgerflow.workflow_worker_versions (instance, workflow, version)
SELECT %(instance)s, u.workflow, u.version FROM unnest(%(workflows)s::text[], %(versions)s::text[]) AS u(workflow, version)
ON CONFLICT DO NOTHING

-- name: versions_without_worker
-- Nodes ready to run whose run's version no live worker has: they wait until one that has it starts.
-- Live: the process holds its presence (workflows/presence.py); without a trusted presence (behind a
-- transaction-mode pooler) a worker cannot be told alive, and its versions are not counted.
WITH live AS (
    SELECT DISTINCT v.workflow, v.version
      FROM ledgerflow.workflow_worker_versions v
      JOIN ledgerflow.wf_worker_presence() p ON p.instance = v.instance AND p.alive
)
SELECT q.workflow, q.version, count(DISTINCT q.run_id)::int AS runs, count(*)::int AS nodes,
       min(q.ready_at) AS waiting_since
  FROM ledgerflow.workflow_queue q
 WHERE q.status = 'ready'
   AND NOT EXISTS (SELECT FROM live WHERE live.workflow = q.workflow AND live.version = q.version)
 GROUP BY q.workflow, q.version
 ORDER BY q.workflow, q.version

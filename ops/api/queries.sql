-- The API's own probes. Every statement ops.api runs is here, named (ops/api/probes.py runs them).

-- name: ping
SELECT 1

-- name: live_workflow_workers
-- Workers holding an unexpired node lease right now, or that recorded a recovery sweep lately (workers
-- sweep on start-up and whenever they find something, so an idle worker shows up through the first).
SELECT worker_name FROM ledgerflow.workflow_queue
 WHERE status = 'claimed' AND lease_expires_at > clock_timestamp() AND worker_name IS NOT NULL
UNION
-- Recovery rows name `<worker name>/<instance>`; `ledgerflow recover` run by hand (`cli:...`) is no worker.
SELECT split_part(worker, '/', 1) FROM ledgerflow.workflow_recoveries
 WHERE started_at > clock_timestamp() - make_interval(secs => %(recent_seconds)s)
   AND worker NOT LIKE 'cli:%%'
 ORDER BY 1

-- name: live_projection_owners
-- The projections (of those named) whose lease a projector holds right now.
SELECT projection FROM ledgerflow.projection_leases
 WHERE projection = ANY(%(projections)s) AND expires_at > clock_timestamp()
 ORDER BY 1

-- Bulk operator actions (workflows.bulk): their record and progress in ledgerflow.bulk_actions.

-- name: insert
INSERT INTO ledgerflow.bulk_actions (id, tenant, kind, actor, filter, matched, max_runs, top_created_at,
                                     top_run_id)
VALUES (%(id)s, %(tenant)s, %(kind)s, %(actor)s, %(filter)s, %(matched)s, %(max_runs)s, %(top_created_at)s,
        %(top_run_id)s)
RETURNING *

-- name: get
-- Another tenant's action is not found.
SELECT * FROM ledgerflow.bulk_actions WHERE id = %(id)s AND tenant = %(tenant)s

-- name: try_lock
-- One process works an action's page at a time: a transaction lock, taken in the page's own transaction
-- (or a one-run count's), so the lock needs no connection beside the page's and ends with its transaction
-- (a killed process's too: a resume never waits for a lease to lapse). A process that finds it taken
-- leaves the action to the one that holds it.
SELECT pg_try_advisory_xact_lock(hashtextextended('ledgerflow.bulk_actions:' || %(id)s::text, 0)) AS held

-- name: progress
-- The counts and the keyset position move together, so a resume continues right below the last run
-- whose outcome is counted (a run acted on but not yet counted is met again and found done by its key).
-- Runs are counted once: only while the position is still above the first (newest) of them, so that two
-- processes working the action in turns cannot both count a page (one that read a page, and one that
-- worked the same page while the first waited between its transactions).
UPDATE ledgerflow.bulk_actions
   SET done = done + %(done)s, failed = failed + %(failed)s, skipped = skipped + %(skipped)s,
       last_created_at = %(created_at)s, last_run_id = %(run_id)s,
       last_error = coalesce(%(error)s, last_error), updated_at = now()
 WHERE id = %(id)s AND tenant = %(tenant)s AND state = 'running'
   AND (last_run_id IS NULL
        OR (last_created_at, last_run_id) > (%(first_created_at)s::timestamptz, %(first_run_id)s::uuid))
RETURNING *

-- name: finish
UPDATE ledgerflow.bulk_actions
   SET state = %(state)s, last_error = coalesce(%(error)s, last_error), updated_at = now(), ended_at = now()
 WHERE id = %(id)s AND tenant = %(tenant)s AND state = 'running'
RETURNING *

-- name: unfinished
-- Running actions of every tenant that no process has advanced for `idle_seconds`: those whose process
-- was killed (and, harmlessly, those being worked slowly: a second worker that meets the first's page
-- lock, or finds its page counted, leaves). Oldest first, bounded.
SELECT * FROM ledgerflow.bulk_actions
 WHERE state = 'running' AND updated_at < now() - make_interval(secs => %(idle_seconds)s)
 ORDER BY updated_at
 LIMIT %(limit)s

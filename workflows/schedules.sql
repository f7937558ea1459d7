-- Statements of workflows.schedules, on ledgerflow.workflow_schedules (migration 0014).

-- name: ensure_schedule
-- A schedule seen for the first time starts from its latest tick before now: no run for the past.
INSERT INTO ledgerflow.workflow_schedules (tenant, workflow, cron, catch_up, last_tick)
VALUES (%(tenant)s, %(workflow)s, %(cron)s, %(catch_up)s, %(last_tick)s)
ON CONFLICT (tenant, workflow) DO NOTHING

-- name: lock_schedule
-- One worker decides a schedule's ticks at a time: the row stays locked until its runs are started and
-- last_tick has moved. Another worker skips it rather than waiting, and finds the ticks done.
SELECT last_tick FROM ledgerflow.workflow_schedules
WHERE tenant = %(tenant)s AND workflow = %(workflow)s
FOR UPDATE SKIP LOCKED

-- name: advance_schedule
UPDATE ledgerflow.workflow_schedules
SET last_tick = %(last_tick)s, last_run_id = %(run_id)s, cron = %(cron)s, catch_up = %(catch_up)s,
    ticks_started = ticks_started + %(started)s, ticks_skipped = ticks_skipped + %(skipped)s,
    updated_at = now()
WHERE tenant = %(tenant)s AND workflow = %(workflow)s

-- name: list_schedules
SELECT tenant, workflow, cron, catch_up, last_tick, last_run_id, ticks_started, ticks_skipped, updated_at
FROM ledgerflow.workflow_schedules
ORDER BY tenant, workflow

-- Debounced starts (migrations/0033_workflow_debounces.sql).

-- name: debounce
-- One start of a burst: the first makes the row (its burst id names the run), every later one keeps its
-- own input and moves the due time to its own window's end, never past the burst's deadline. Atomic under
-- concurrent starts (INSERT ... ON CONFLICT DO UPDATE): however many start at once, one row per burst.
-- A start that meets a row being fired waits for that transaction; the row is then gone, and this start
-- begins the next burst.
INSERT INTO ledgerflow.workflow_debounces AS d (tenant, workflow, key, burst, input, due_at, deadline)
SELECT %(tenant)s, %(workflow)s, %(key)s, %(burst)s, %(input)s::jsonb, least(w.due_at, w.deadline), w.deadline
  FROM (SELECT clock_timestamp() + make_interval(secs => %(window)s) AS due_at,
               coalesce(clock_timestamp() + make_interval(secs => %(max_wait)s::float8), 'infinity')
                   AS deadline) AS w
ON CONFLICT (tenant, workflow, key) DO UPDATE
   -- greatest: a start that waited for the row's lock read the clock before a start that wrote first.
   SET input = excluded.input, starts = d.starts + 1,
       due_at = greatest(d.due_at, least(excluded.due_at, d.deadline))
RETURNING d.burst, d.starts, d.due_at

-- name: take_due
-- The longest-due burst of these workflows that no other worker is firing at this moment (SKIP LOCKED); its
-- row lock is held until the run is started and the row deleted, in this transaction.
SELECT tenant, workflow, key, burst, input::text AS input, starts
  FROM ledgerflow.workflow_debounces
 WHERE due_at <= clock_timestamp() AND workflow = ANY(%(workflows)s)
 ORDER BY due_at
 LIMIT 1
   FOR UPDATE SKIP LOCKED

-- name: fired
DELETE FROM ledgerflow.workflow_debounces
 WHERE tenant = %(tenant)s AND workflow = %(workflow)s AND key = %(key)s AND burst = %(burst)s

-- name: postpone
-- A burst whose run the tenant's quota refused for now: it is looked at again later.
UPDATE ledgerflow.workflow_debounces SET due_at = clock_timestamp() + make_interval(secs => %(delay)s)
 WHERE tenant = %(tenant)s AND workflow = %(workflow)s AND key = %(key)s AND burst = %(burst)s

-- name: next_due
-- Seconds until the soonest burst of these workflows is due (negative: overdue), NULL when there is none.
SELECT extract(epoch FROM min(due_at) - clock_timestamp())::float8
  FROM ledgerflow.workflow_debounces
 WHERE workflow = ANY(%(workflows)s)

-- name: pending
-- Bursts not fired yet, oldest first (for operators and tests).
SELECT tenant, workflow, key, burst, starts, first_at, due_at
  FROM ledgerflow.workflow_debounces
 ORDER BY due_at

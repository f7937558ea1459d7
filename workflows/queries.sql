-- The workflow package's SQL. Every statement it runs is here, named.

-- name: enqueue
-- (Arrays travel in binary, here and below: in text each element is escaped by a regular expression.)
-- Makes nodes runnable (again). Runs in the transaction that appends the event making them runnable.
-- Attempts continue from the run's history: a node run again after a retry gets a new attempt number.
-- The version is given: the queue's version trigger (migration 0016) need not read it from the log.
INSERT INTO ledgerflow.workflow_queue AS q
       (run_id, node, tenant, workflow, version, attempt, max_crashes, progress_deadline, on_stuck, ready_at)
SELECT %(run_id)s, u.node, %(tenant)s, %(workflow)s, %(version)s, u.attempt, u.max_crashes, u.progress_deadline,
       u.on_stuck, clock_timestamp() + make_interval(secs => u.delay)
  FROM unnest(%(nodes)b::text[], %(attempts)b::int[], %(max_crashes)b::int[],
              %(progress_deadlines)b::float8[], %(on_stuck)b::text[], %(delays)b::float8[])
       AS u(node, attempt, max_crashes, progress_deadline, on_stuck, delay)
ON CONFLICT (run_id, node) DO UPDATE
   SET status = 'ready', ready_at = excluded.ready_at, token = NULL, worker_name = NULL, attempt = excluded.attempt,
       worker_instance = NULL, lease_expires_at = NULL, cancel_requested = false,
       crashes = CASE WHEN %(reset_crashes)s THEN 0 ELSE q.crashes END

-- name: start_run
-- A run's first events and its first nodes queued, in one statement (one round trip, one transaction); see
-- ledgerflow.wf_start_run. The event parameters are the one-stream append's.
SELECT stream_id, stream_version, position, transaction_id
  FROM ledgerflow.wf_start_run(
           %(tenant)s, %(stream_id)s, %(event_ids)b::uuid[], %(types)b::text[], %(data)b::text[],
           %(metadata)b::text[], %(correlation_ids)b::uuid[], %(causation_ids)b::uuid[], %(run_id)s,
           %(workflow)s, %(version)s, %(nodes)b::text[], %(max_crashes)b::int[],
           %(progress_deadlines)b::float8[], %(on_stuck)b::text[])

-- name: claim
-- Exactly one winner per node: SKIP LOCKED hands each ready row to one claimer, and the token, fresh
-- from a sequence, fences every later write of this claim. Bounded whatever the backlog: for each of the
-- worker's workflows, the walk of the ready index (workflow, ready_at) stops after %(limit)s unlocked rows
-- (statement_timestamp(), unlike clock_timestamp(), can bound the index scan). Rows a workflow's walk
-- locked beyond the overall limit stay unclaimed and are unlocked at commit.
-- Nodes with limits (workflows/limits.py) are claimed only with a slot of each: see `refused`.
-- Only nodes of runs started with a version the worker has: one walk per (workflow, version) it has,
-- of the ready index (workflow, version, ready_at) (migration 0016).
-- Each claim's NodeClaimed is appended to its run's stream by the same statement: a claim is one round
-- trip, and in autocommit one transaction.
WITH picked AS (
    SELECT r.run_id, r.node, w.name AS workflow, row_number() OVER (ORDER BY r.ready_at)::int AS n
      FROM unnest(%(workflows)b::text[], %(versions)b::text[]) AS w(name, version)
     CROSS JOIN LATERAL (
          SELECT q.run_id, q.node, q.ready_at FROM ledgerflow.workflow_queue q
           WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
             AND q.ready_at <= statement_timestamp()
           ORDER BY q.ready_at
           LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED
     ) r
     ORDER BY r.ready_at
     LIMIT %(limit)s
), needs AS (
    -- The limits each picked node needs: one index probe per node, nothing found when nothing has limits.
    SELECT p.n, unnest(nl.limits) AS key
      FROM picked p JOIN ledgerflow.workflow_node_limits nl ON nl.workflow = p.workflow AND nl.node = p.node
), refused AS (
    -- Admission, only when a picked node needs a slot: exact under concurrent claimers (an advisory lock
    -- per limit key until commit; see ledgerflow.wf_limits_admit).
    SELECT g.candidate, g.wake_at
      FROM (SELECT WHERE EXISTS (SELECT FROM needs)) AS some_needs
     CROSS JOIN LATERAL ledgerflow.wf_limits_admit(ARRAY(SELECT n FROM needs ORDER BY n, key),
                                                   ARRAY(SELECT key FROM needs ORDER BY n, key)) g
     WHERE NOT g.admitted
), deferred AS (
    -- A node refused a slot stays ready, due again when a slot may be free: until then the walk passes
    -- it by, so the nodes queued behind it are not starved.
    UPDATE ledgerflow.workflow_queue q SET ready_at = refused.wake_at
      FROM picked JOIN refused ON refused.candidate = picked.n
     WHERE q.run_id = picked.run_id AND q.node = picked.node
), claimed AS (
    UPDATE ledgerflow.workflow_queue q
       SET status = 'claimed', attempt = q.attempt + 1, token = nextval('ledgerflow.workflow_fencing_tokens'),
           worker_name = %(worker_name)s, worker_instance = %(instance)s, claimed_at = clock_timestamp(),
           heartbeat_at = clock_timestamp(), progress_at = clock_timestamp(),
           lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s), waiting_for = NULL
      FROM picked
     WHERE q.run_id = picked.run_id AND q.node = picked.node AND picked.n NOT IN (SELECT candidate FROM refused)
    RETURNING q.run_id, q.node, q.tenant, q.workflow, q.attempt, q.token, q.cancel_requested, q.crashes,
              q.version
), ordered AS (
    -- In the order the run streams are locked in (see ledgerflow.wf_record_claims).
    SELECT c.*, row_number() OVER (ORDER BY c.tenant, c.run_id, c.node) AS k FROM claimed c
)
-- Each claim with its NodeClaimed event, appended in this statement (migration 0026).
SELECT o.run_id, o.node, o.tenant, o.workflow, o.attempt, o.token, o.cancel_requested, o.crashes, o.version,
       r.stream_id, r.stream_version, r.position, r.transaction_id
  FROM ordered o
  JOIN ledgerflow.wf_record_claims(ARRAY(SELECT tenant FROM ordered ORDER BY k),
                                   ARRAY(SELECT run_id FROM ordered ORDER BY k),
                                   ARRAY(SELECT node FROM ordered ORDER BY k),
                                   ARRAY(SELECT attempt FROM ordered ORDER BY k),
                                   ARRAY(SELECT token FROM ordered ORDER BY k), %(worker_id)s) r ON r.k = o.k
 ORDER BY o.k

-- name: fencing_tokens
-- A block of fencing tokens for the claims a worker makes itself at a node's end (see FencingTokens).
SELECT nextval('ledgerflow.workflow_fencing_tokens') FROM generate_series(1, %(count)s)

-- name: fence
SELECT ledgerflow.wf_fence(%(run_id)s, %(node)s, %(token)s, %(check_cancel)s)

-- name: fence_at
-- The fence of a node's write, with the transaction's timestamp (the recorded_at of the events it appends).
SELECT now() FROM ledgerflow.wf_fence(%(run_id)s, %(node)s, %(token)s, %(check_cancel)s)

-- name: end_node
-- A node's end for the queue, in one statement; see ledgerflow.wf_end_node for the guarantees.
SELECT crashes, recorded_at
  FROM ledgerflow.wf_end_node(%(run_id)s, %(node)s, %(token)s, %(check_cancel)s, %(retry_in)s, %(tenant)s,
                              %(workflow)s, %(ready)b::text[], %(attempts)b::int[], %(max_crashes)b::int[],
                              %(progress_deadlines)b::float8[], %(on_stuck)b::text[], %(claim_token)s,
                              %(worker_name)s, %(instance)s, %(ttl)s)

-- name: record_node_end
-- A node's end for the queue and the run-stream events that record it, in one statement (one round trip,
-- one transaction); see ledgerflow.wf_record_node_end. The event parameters are the one-stream append's.
-- Arrays travel in binary: in text, each element would be escaped by a regular expression.
SELECT crashes, recorded_at, stream_id, stream_version, position, transaction_id
  FROM ledgerflow.wf_record_node_end(
           %(run_id)s, %(node)s, %(token)s, %(check_cancel)s, %(retry_in)s, %(tenant)s, %(workflow)s,
           %(ready)b::text[], %(attempts)b::int[], %(max_crashes)b::int[], %(progress_deadlines)b::float8[],
           %(on_stuck)b::text[], %(claim_token)s, %(worker_name)s, %(instance)s, %(ttl)s,
           %(stream_id)s, %(expected)s, %(event_ids)b::uuid[], %(types)b::text[], %(data)b::text[],
           %(metadata)b::text[], %(correlation_ids)b::uuid[], %(causation_ids)b::uuid[])

-- name: suspend_node
-- A node suspends itself (a timer or a signal wait); see ledgerflow.wf_suspend_node.
SELECT ledgerflow.wf_suspend_node(%(run_id)s, %(node)s, %(token)s, %(until)s, %(now)s, %(signal)s)

-- name: next_due
-- Seconds until the earliest ready row of these workflows that is due later but within %(within)s seconds
-- (a timer, a signal wait's timeout, a retry), or NULL: the idle worker wakes for it instead of polling.
-- Rows already due are not looked at: those the claim left (locked by a peer, held back by a limit) must
-- not turn the idle wait into a busy loop.
SELECT extract(epoch FROM min(r.ready_at) - clock_timestamp())::float8
  FROM unnest(%(workflows)b::text[]) AS w(name)
 CROSS JOIN LATERAL (
      SELECT q.ready_at FROM ledgerflow.workflow_queue q
       WHERE q.status = 'ready' AND q.workflow = w.name AND q.ready_at > statement_timestamp()
         AND q.ready_at <= statement_timestamp() + make_interval(secs => %(within)s)
       ORDER BY q.ready_at
       LIMIT 1
 ) r

-- name: lock_run_nodes
-- Before a signal is recorded: wait for every change of the run's queue rows in flight (a node suspending
-- itself to wait for this signal, say) and hold them until the signal commits, so that a wait is either
-- recorded before the signal, and woken by `wake_waiting` (whose own snapshot, taken after this statement,
-- sees it), or after it, and then fails on the run stream's version and finds the signal.
-- An active run always has a row here (a ready, claimed, waiting or parked node); none: the run ended, or is
-- not this tenant's.
SELECT node FROM ledgerflow.workflow_queue
 WHERE run_id = %(run_id)s AND tenant = %(tenant)s
 ORDER BY node
   FOR UPDATE

-- name: wake_waiting
-- The nodes waiting for this signal are due now.
UPDATE ledgerflow.workflow_queue
   SET ready_at = clock_timestamp()
 WHERE run_id = %(run_id)s AND status = 'ready' AND waiting_for = %(signal)s
   AND ready_at > clock_timestamp()

-- name: begin
BEGIN

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- name: release
-- Graceful hand-over on shutdown: the node is ready again at once, and it does not count as a crash.
UPDATE ledgerflow.workflow_queue
   SET status = 'ready', ready_at = clock_timestamp(), token = NULL, worker_name = NULL,
       worker_instance = NULL, lease_expires_at = NULL
 WHERE run_id = %(run_id)s AND node = %(node)s AND token = %(token)s
RETURNING run_id

-- name: heartbeat
-- One statement renews every lease of this worker process. Heartbeats stay out of the log.
UPDATE ledgerflow.workflow_queue
   SET heartbeat_at = clock_timestamp(), lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
 WHERE status = 'claimed' AND worker_instance = %(instance)s AND token = ANY (%(tokens)s::bigint[])
   AND lease_expires_at > clock_timestamp()
RETURNING token

-- name: cancel_run
-- Pending nodes never start: their rows go. Claimed nodes learn of it at their next fenced write.
WITH flagged AS (
    UPDATE ledgerflow.workflow_queue SET cancel_requested = true
     WHERE run_id = %(run_id)s AND status = 'claimed'
    RETURNING node
), dropped AS (
    DELETE FROM ledgerflow.workflow_queue WHERE run_id = %(run_id)s AND status IN ('ready', 'parked')
    RETURNING node
)
SELECT (SELECT coalesce(array_agg(node), '{}') FROM flagged), (SELECT coalesce(array_agg(node), '{}') FROM dropped)

-- name: recent_recoveries
SELECT id, worker, trigger, started_at, duration_ms, found, reclaimed, parked, stuck, failed
  FROM ledgerflow.workflow_recoveries ORDER BY id DESC LIMIT %(limit)s

-- name: queue_summary
-- What recovery would look at: nodes waiting, running, with a lapsed lease (orphans), parked.
SELECT count(*) FILTER (WHERE status = 'ready'),
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at > clock_timestamp()),
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at <= clock_timestamp()),
       count(*) FILTER (WHERE status = 'parked')
  FROM ledgerflow.workflow_queue


-- name: list_runs
-- `waiting`: what the run's waiting nodes wait for ("signal approve", "timer"), or NULL.
SELECT run_id, workflow, key, status, current_node, nodes_total, nodes_done, error, cancel_requested,
       created_at, updated_at, finished_at,
       (SELECT string_agg(coalesce('signal ' || n.waiting_for, 'timer'), ', ' ORDER BY n.position)
          FROM ledgerflow.workflow_nodes n
         WHERE n.run_id = r.run_id AND n.status = 'waiting') AS waiting
  FROM ledgerflow.workflow_runs r
 WHERE tenant = %(tenant)s
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
 ORDER BY created_at DESC
 LIMIT %(limit)s

-- name: run_nodes
SELECT node, position, status, attempt, crashes, generation, progress_current, progress_total, progress_message,
       checkpoints, worker, error, stuck, started_at, finished_at, duration_ms, updated_at, waiting_for, wake_at
  FROM ledgerflow.workflow_nodes
 WHERE run_id = %(run_id)s
 ORDER BY position

-- The workflow package's SQL. Every statement it runs is here, named.

-- name: enqueue
-- (Arrays travel in binary, here and below: in text each element is escaped by a regular expression.)
-- Makes nodes runnable (again). Runs in the transaction that appends the event making them runnable.
-- Attempts continue from the run's history: a node run again after a retry gets a new attempt number.
-- The version is given: the queue's version trigger (migration 0016) need not read it from the log; so is
-- the priority at a start (NULL otherwise: the priority trigger of migration 0028 reads the run's).
INSERT INTO ledgerflow.workflow_queue AS q
       (run_id, node, tenant, workflow, version, attempt, max_crashes, progress_deadline, on_stuck, ready_at,
        priority)
SELECT %(run_id)s, u.node, %(tenant)s, %(workflow)s, %(version)s, u.attempt, u.max_crashes, u.progress_deadline,
       u.on_stuck, clock_timestamp() + make_interval(secs => u.delay), %(priority)s::int
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
      p_tenant => %(tenant)s, p_stream_id => %(stream_id)s, p_event_ids => %(event_ids)b::uuid[],
      p_types => %(types)b::text[], p_data => %(data)b::text[], p_metadata => %(metadata)b::text[],
      p_correlation_ids => %(correlation_ids)b::uuid[], p_causation_ids => %(causation_ids)b::uuid[],
      p_run_id => %(run_id)s, p_workflow => %(workflow)s, p_version => %(version)s,
      p_nodes => %(nodes)b::text[], p_max_crashes => %(max_crashes)b::int[],
      p_progress_deadlines => %(progress_deadlines)b::float8[], p_on_stuck => %(on_stuck)b::text[],
      p_priority => %(priority)s::int)

-- name: claim
-- Exactly one winner per node (SKIP LOCKED), a fresh fencing token per claim, tenants served in turn and
-- priorities within a tenant by walks of the ready index bounded whatever the backlog, admission of nodes
-- with limits, and each claim's NodeClaimed appended to its run's stream, all in one statement: see
-- ledgerflow.wf_claim (migrations 0027, 0028). In autocommit a claim is one round trip and one transaction.
SELECT run_id, node, tenant, workflow, attempt, token, cancel_requested, crashes, version,
       stream_id, stream_version, position, transaction_id
  FROM ledgerflow.wf_claim(
      p_worker_name => %(worker_name)s, p_instance => %(instance)s, p_worker_id => %(worker_id)s,
      p_workflows => %(workflows)b::text[], p_versions => %(versions)b::text[], p_limit => %(limit)s,
      p_ttl => %(ttl)s)

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
SELECT crashes AS successor_crashes, recorded_at
  FROM ledgerflow.wf_end_node(
      p_run_id => %(run_id)s, p_node => %(node)s, p_token => %(token)s, p_check_cancel => %(check_cancel)s,
      p_retry_in => %(retry_in)s, p_tenant => %(tenant)s, p_workflow => %(workflow)s,
      p_ready => %(ready)b::text[], p_attempts => %(attempts)b::int[],
      p_max_crashes => %(max_crashes)b::int[], p_progress_deadlines => %(progress_deadlines)b::float8[],
      p_on_stuck => %(on_stuck)b::text[], p_claim_token => %(claim_token)s, p_worker_name => %(worker_name)s,
      p_instance => %(instance)s, p_ttl => %(ttl)s)

-- name: record_node_end
-- A node's end for the queue and the run-stream events that record it, in one statement (one round trip,
-- one transaction); see ledgerflow.wf_record_node_end. The event parameters are the one-stream append's.
-- Arrays travel in binary: in text, each element would be escaped by a regular expression.
SELECT crashes, recorded_at, stream_id, stream_version, position, transaction_id
  FROM ledgerflow.wf_record_node_end(
      p_run_id => %(run_id)s, p_node => %(node)s, p_token => %(token)s, p_check_cancel => %(check_cancel)s,
      p_retry_in => %(retry_in)s, p_tenant => %(tenant)s, p_workflow => %(workflow)s,
      p_ready => %(ready)b::text[], p_attempts => %(attempts)b::int[],
      p_max_crashes => %(max_crashes)b::int[], p_progress_deadlines => %(progress_deadlines)b::float8[],
      p_on_stuck => %(on_stuck)b::text[], p_claim_token => %(claim_token)s, p_worker_name => %(worker_name)s,
      p_instance => %(instance)s, p_ttl => %(ttl)s, p_stream_id => %(stream_id)s, p_expected => %(expected)s,
      p_event_ids => %(event_ids)b::uuid[], p_types => %(types)b::text[], p_data => %(data)b::text[],
      p_metadata => %(metadata)b::text[], p_correlation_ids => %(correlation_ids)b::uuid[],
      p_causation_ids => %(causation_ids)b::uuid[])

-- name: record_run_end
-- `record_node_end` for an end that finishes a run without a key, followed by the claim of a ready node of
-- another run for the same worker and the read of that run's stream, in one statement (one round trip, one
-- transaction); see ledgerflow.wf_record_run_end. Rows with a NULL run_id are the end's appended events;
-- with a run_id and no event_id, claims; with an event_id, the claimed run's events.
SELECT crashes, recorded_at, stream_id, stream_version, position, transaction_id, run_id, node, tenant,
       workflow, attempt, token, cancel_requested, claim_crashes, version, event_id, event_type, data,
       metadata, correlation_id, causation_id, event_recorded_at
  FROM ledgerflow.wf_record_run_end(
      p_run_id => %(run_id)s, p_node => %(node)s, p_token => %(token)s, p_check_cancel => %(check_cancel)s,
      p_retry_in => %(retry_in)s, p_tenant => %(tenant)s, p_workflow => %(workflow)s,
      p_ready => %(ready)b::text[], p_attempts => %(attempts)b::int[],
      p_max_crashes => %(max_crashes)b::int[], p_progress_deadlines => %(progress_deadlines)b::float8[],
      p_on_stuck => %(on_stuck)b::text[], p_claim_token => %(claim_token)s, p_worker_name => %(worker_name)s,
      p_instance => %(instance)s, p_ttl => %(ttl)s, p_stream_id => %(stream_id)s, p_expected => %(expected)s,
      p_event_ids => %(event_ids)b::uuid[], p_types => %(types)b::text[], p_data => %(data)b::text[],
      p_metadata => %(metadata)b::text[], p_correlation_ids => %(correlation_ids)b::uuid[],
      p_causation_ids => %(causation_ids)b::uuid[], p_claim_worker_name => %(claim_worker_name)s,
      p_claim_instance => %(claim_instance)s, p_claim_worker_id => %(claim_worker_id)s,
      p_claim_workflows => %(claim_workflows)b::text[], p_claim_versions => %(claim_versions)b::text[],
      p_claim_ttl => %(claim_ttl)s, p_read_limit => %(read_limit)s)

-- name: suspend_node
-- A node suspends itself (a timer or a signal wait); see ledgerflow.wf_suspend_node.
SELECT ledgerflow.wf_suspend_node(
    p_run_id => %(run_id)s, p_node => %(node)s, p_token => %(token)s, p_until => %(until)s, p_now => %(now)s,
    p_signal => %(signal)s)

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
-- The nodes waiting for this signal are due now (those of a paused run once it is resumed).
UPDATE ledgerflow.workflow_queue
   SET ready_at = clock_timestamp()
 WHERE run_id = %(run_id)s AND status IN ('ready', 'paused') AND waiting_for = %(signal)s
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

-- name: forget_pause
DELETE FROM ledgerflow.workflow_paused_runs WHERE run_id = %(run_id)s

-- name: hand_back
-- A node interrupted by its run's pause goes back, not counted as a crash: paused while the run is (so no
-- claim walks it), else ready at once; its interruption flag is cleared, so that the next claim runs it.
UPDATE ledgerflow.workflow_queue q
   SET status = CASE WHEN EXISTS (SELECT 1 FROM ledgerflow.workflow_paused_runs pr WHERE pr.run_id = q.run_id)
                     THEN 'paused' ELSE 'ready' END,
       ready_at = clock_timestamp(), token = NULL, worker_name = NULL, worker_instance = NULL,
       lease_expires_at = NULL, cancel_requested = false
 WHERE run_id = %(run_id)s AND node = %(node)s AND token = %(token)s AND status = 'claimed'
RETURNING run_id

-- name: heartbeat
-- One statement renews every lease of this worker process, each for the TTL from when its row is locked:
-- see ledgerflow.wf_heartbeat (migration 0034). Heartbeats stay out of the log.
SELECT ledgerflow.wf_heartbeat(%(instance)s, %(tokens)s::bigint[], %(ttl)s)

-- name: cancel_run
-- Pending nodes never start: their rows go. Claimed nodes learn of it at their next fenced write. A
-- cancelled run is no longer paused: its pause goes with it (migration 0049).
WITH flagged AS (
    UPDATE ledgerflow.workflow_queue SET cancel_requested = true
     WHERE run_id = %(run_id)s AND status = 'claimed'
    RETURNING node
), dropped AS (
    DELETE FROM ledgerflow.workflow_queue
     WHERE run_id = %(run_id)s AND status IN ('ready', 'parked', 'paused')
    RETURNING node
), unpaused AS (
    DELETE FROM ledgerflow.workflow_paused_runs WHERE run_id = %(run_id)s
)
SELECT (SELECT coalesce(array_agg(node), '{}') FROM flagged) AS running,
       (SELECT coalesce(array_agg(node), '{}') FROM dropped) AS dropped

-- name: cancel_runs
-- `cancel_run` for many runs in one statement (a bulk cancel's batch), with the same effect per run. The
-- batch's rows are locked first in (run, node) order, so two batches over overlapping runs, or a batch and
-- a one-run change, queue on one another instead of deadlocking. Returns (run, running, dropped) per run.
WITH locked AS (
    SELECT q.run_id, q.node FROM ledgerflow.workflow_queue q
     WHERE q.run_id = ANY(%(run_ids)s::uuid[])
     ORDER BY q.run_id, q.node
       FOR UPDATE
), flagged AS (
    UPDATE ledgerflow.workflow_queue q SET cancel_requested = true
      FROM locked l
     WHERE q.run_id = l.run_id AND q.node = l.node AND q.status = 'claimed'
    RETURNING q.run_id, q.node
), dropped AS (
    DELETE FROM ledgerflow.workflow_queue q
     USING locked l
     WHERE q.run_id = l.run_id AND q.node = l.node AND q.status IN ('ready', 'parked', 'paused')
    RETURNING q.run_id, q.node
), unpaused AS (
    DELETE FROM ledgerflow.workflow_paused_runs WHERE run_id = ANY(%(run_ids)s::uuid[])
)
SELECT r.run_id,
       coalesce((SELECT array_agg(f.node) FROM flagged f WHERE f.run_id = r.run_id), '{}') AS running,
       coalesce((SELECT array_agg(d.node) FROM dropped d WHERE d.run_id = r.run_id), '{}') AS dropped
  FROM unnest(%(run_ids)s::uuid[]) AS r(run_id)

-- name: terminate_run
-- After `lock_run_nodes`: every row of the run goes, claimed ones too (their holders' next fenced write
-- fails: the lease is lost), and so does its pause. Returns the nodes dropped.
WITH unpaused AS (
    DELETE FROM ledgerflow.workflow_paused_runs WHERE run_id = %(run_id)s
), dropped AS (
    DELETE FROM ledgerflow.workflow_queue WHERE run_id = %(run_id)s
    RETURNING node
)
SELECT coalesce(array_agg(node ORDER BY node), '{}') FROM dropped

-- name: pause_run
-- In the transaction that appends RunPaused, after `lock_run_nodes` (every row of the run locked: a claim,
-- a node's end or a reclaim in flight commits first, or waits for this and then sees the pause; see
-- migration 0049). The run's ready rows move to `paused`, keeping their place; with %(interrupt)s, its
-- claimed nodes are flagged as a cancellation flags them, so that each stops at its next fenced write
-- (the worker then hands it back: see Lifecycle.cancelled). Returns (running, held) node names.
WITH paused AS (
    INSERT INTO ledgerflow.workflow_paused_runs (run_id, tenant) VALUES (%(run_id)s, %(tenant)s)
    ON CONFLICT (run_id) DO NOTHING
), held AS (
    UPDATE ledgerflow.workflow_queue SET status = 'paused'
     WHERE run_id = %(run_id)s AND status = 'ready'
    RETURNING node
), running AS (
    UPDATE ledgerflow.workflow_queue SET cancel_requested = cancel_requested OR %(interrupt)s
     WHERE run_id = %(run_id)s AND status = 'claimed'
    RETURNING node
)
SELECT (SELECT coalesce(array_agg(node ORDER BY node), '{}') FROM running) AS running,
       (SELECT coalesce(array_agg(node ORDER BY node), '{}') FROM held) AS held

-- name: resume_run
-- In the transaction that appends RunResumed, after `lock_run_nodes`: the pause goes first, then the
-- run's paused rows are ready again where they were (their ready_at kept), and the interruption flags of
-- its nodes are cleared (a run that is being cancelled is not resumed). Returns the nodes made ready.
WITH unpaused AS (
    DELETE FROM ledgerflow.workflow_paused_runs WHERE run_id = %(run_id)s
), cleared AS (
    -- Claimed nodes not yet interrupted go on; nodes taken back from a dead worker while interrupted run.
    UPDATE ledgerflow.workflow_queue SET cancel_requested = false
     WHERE run_id = %(run_id)s AND status <> 'paused' AND cancel_requested
), ready AS (
    UPDATE ledgerflow.workflow_queue SET status = 'ready', cancel_requested = false
     WHERE run_id = %(run_id)s AND status = 'paused'
    RETURNING node
)
SELECT coalesce(array_agg(node ORDER BY node), '{}') FROM ready

-- name: pause_runs
-- `pause_run` without interrupting running nodes, for many runs of one tenant in one statement (a bulk
-- pause's page), with the same effect per run. The page's rows are locked first in (run, node) order, as
-- `cancel_runs` locks them, so that two pages over overlapping runs, or a page and a one-run change (a
-- claim, a node's end: see migration 0049), queue on one another instead of deadlocking, and a claim in
-- flight commits first or then sees the pause. Returns the number of rows held.
WITH locked AS (
    SELECT q.run_id, q.node FROM ledgerflow.workflow_queue q
     WHERE q.run_id = ANY(%(run_ids)s::uuid[]) AND q.tenant = %(tenant)s
     ORDER BY q.run_id, q.node
       FOR UPDATE
), paused AS (
    INSERT INTO ledgerflow.workflow_paused_runs (run_id, tenant)
    SELECT r.run_id, %(tenant)s FROM unnest(%(run_ids)s::uuid[]) AS r(run_id)
    ON CONFLICT (run_id) DO NOTHING
), held AS (
    UPDATE ledgerflow.workflow_queue q SET status = 'paused'
      FROM locked l
     WHERE q.run_id = l.run_id AND q.node = l.node AND q.status = 'ready'
    RETURNING q.run_id
)
SELECT count(*) FROM held

-- name: resume_runs
-- `resume_run` for many runs of one tenant in one statement (a bulk resume's page), rows locked in (run,
-- node) order as `pause_runs` locks them. Returns the number of rows made ready.
WITH locked AS (
    SELECT q.run_id, q.node FROM ledgerflow.workflow_queue q
     WHERE q.run_id = ANY(%(run_ids)s::uuid[]) AND q.tenant = %(tenant)s
     ORDER BY q.run_id, q.node
       FOR UPDATE
), unpaused AS (
    DELETE FROM ledgerflow.workflow_paused_runs WHERE run_id = ANY(%(run_ids)s::uuid[])
), cleared AS (
    UPDATE ledgerflow.workflow_queue q SET cancel_requested = false
      FROM locked l
     WHERE q.run_id = l.run_id AND q.node = l.node AND q.status <> 'paused' AND q.cancel_requested
), ready AS (
    UPDATE ledgerflow.workflow_queue q SET status = 'ready', cancel_requested = false
      FROM locked l
     WHERE q.run_id = l.run_id AND q.node = l.node AND q.status = 'paused'
    RETURNING q.run_id
)
SELECT count(*) FROM ready

-- name: recent_recoveries
SELECT id, worker, trigger, started_at, duration_ms, found, reclaimed, parked, stuck, failed
  FROM ledgerflow.workflow_recoveries ORDER BY id DESC LIMIT %(limit)s

-- name: queue_summary
-- What recovery would look at: nodes waiting, running, with a lapsed lease (orphans), parked.
SELECT count(*) FILTER (WHERE status = 'ready') AS ready,
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at > clock_timestamp()) AS running,
       count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at <= clock_timestamp()) AS orphaned,
       count(*) FILTER (WHERE status = 'parked') AS parked
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

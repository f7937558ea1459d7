-- Workflows' hot path: a bounded claim, and every queue change of a node's end in one statement.

-- The claim walks one workflow's ready rows in ready order and stops after the few it takes, however long
-- the backlog: the workflow leads the index, so a worker never steps over other workflows' rows, and
-- successors handed over at a node's end are written as claimed, so they never enter this index at all.
CREATE INDEX workflow_queue_ready_by_workflow ON ledgerflow.workflow_queue (workflow, ready_at)
 WHERE status = 'ready';
DROP INDEX IF EXISTS ledgerflow.workflow_queue_ready;

-- A node's end, for the queue, in one statement (one round trip with the run-stream append that follows it
-- in the same transaction):
--   * the fence: the caller's claim must still hold the node (LF004 otherwise, LF005 if p_check_cancel and
--     the run is being cancelled); the row lock of its change keeps a reclaimer waiting until the
--     transaction commits, and a reclaimer that got there first leaves nothing for it to change;
--   * the node's row goes, or, with p_retry_in, is ready again after that many seconds;
--   * the nodes that became runnable are queued, the first of them already claimed with p_claim_token
--     when the caller hands it to itself (p_claim_token not NULL), so it runs next without a claim.
-- The caller decided which nodes became runnable from the run's state at an exact stream version and
-- appends its events with that expected version in the same transaction: if the run changed meanwhile the
-- append fails, everything here rolls back, and the caller decides again. That is what makes two sibling
-- nodes finishing at once start their common dependent exactly once.
-- Returns the crashes counted so far for the claimed successor (0 for a fresh row) and the transaction's
-- timestamp, which is the recorded_at of the events appended with it.
CREATE FUNCTION ledgerflow.wf_end_node(
    p_run_id              uuid,
    p_node                text,
    p_token               bigint,
    p_check_cancel        boolean,
    p_retry_in            float8,
    p_tenant              text,
    p_workflow            text,
    p_ready               text[],
    p_attempts            int[],
    p_max_crashes         int[],
    p_progress_deadlines  float8[],
    p_on_stuck            text[],
    p_claim_token         bigint,
    p_worker_name         text,
    p_instance            text,
    p_ttl                 float8
) RETURNS TABLE (crashes int, recorded_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_cancel  boolean;
    v_crashes int;
BEGIN
    -- The fence of ledgerflow.wf_fence, folded into the row's own change (one row version, not two): the
    -- row changes only while the caller's claim is the current one and its lease has not lapsed.
    IF p_retry_in IS NULL THEN
        DELETE FROM ledgerflow.workflow_queue q
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested INTO v_cancel;
    ELSE
        UPDATE ledgerflow.workflow_queue q
           SET status = 'ready', ready_at = clock_timestamp() + make_interval(secs => p_retry_in),
               token = NULL, worker_name = NULL, worker_instance = NULL, lease_expires_at = NULL
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested INTO v_cancel;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost' USING ERRCODE = 'LF004',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node, 'token', p_token)::text;
    END IF;
    IF p_check_cancel AND v_cancel THEN
        RAISE EXCEPTION 'run cancelled' USING ERRCODE = 'LF005',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node)::text;
    END IF;

    IF cardinality(p_ready) > 0 THEN
        WITH queued AS (
            INSERT INTO ledgerflow.workflow_queue AS q
                   (run_id, node, tenant, workflow, attempt, max_crashes, progress_deadline, on_stuck, status,
                    ready_at, token, worker_name, worker_instance, claimed_at, heartbeat_at, progress_at,
                    lease_expires_at)
            SELECT p_run_id, u.node, p_tenant, p_workflow, u.attempt, u.max_crashes, u.progress_deadline,
                   u.on_stuck, CASE WHEN u.claimed THEN 'claimed' ELSE 'ready' END, clock_timestamp(),
                   CASE WHEN u.claimed THEN p_claim_token END,
                   CASE WHEN u.claimed THEN p_worker_name END,
                   CASE WHEN u.claimed THEN p_instance END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() + make_interval(secs => p_ttl) END
              FROM (SELECT v.*, (v.n = 1 AND p_claim_token IS NOT NULL) AS claimed
                      FROM unnest(p_ready, p_attempts, p_max_crashes, p_progress_deadlines, p_on_stuck)
                           WITH ORDINALITY AS v(node, attempt, max_crashes, progress_deadline, on_stuck, n)) u
            -- A node queued again (after a retry or a refresh) keeps its crash count.
            ON CONFLICT (run_id, node) DO UPDATE
               SET status = excluded.status, ready_at = excluded.ready_at, token = excluded.token,
                   worker_name = excluded.worker_name, worker_instance = excluded.worker_instance,
                   claimed_at = excluded.claimed_at, heartbeat_at = excluded.heartbeat_at,
                   progress_at = excluded.progress_at, lease_expires_at = excluded.lease_expires_at,
                   attempt = excluded.attempt, cancel_requested = false
            RETURNING q.node, q.crashes
        )
        SELECT queued.crashes INTO v_crashes FROM queued WHERE queued.node = p_ready[1];
    END IF;
    RETURN QUERY SELECT coalesce(v_crashes, 0), now();
END
$$;

-- A node's end, and a node's suspension, take the log writer lock before their first write.
--
-- Both are followed, in their transaction, by the run-stream append that records them. They wrote the
-- queue first, so the transaction had an xid before it held the log writer lock, and the append took the
-- late path of ledgerflow.log_writer: a subtransaction whose xid serves as the stamp (0.11-0.19 ms of
-- server time per node end, measured with track_functions and auto_explain). Taking the lock first gives
-- the append the stamp at once. The transaction holds the lock a statement longer than before, which
-- holds readers of the log back no longer than the append it always makes.
--
-- The successors a node's end queues also take its row's version, the run's, instead of leaving the
-- queue's version trigger (migration 0016) to read it from the run's first event. The functions are
-- otherwise those of migrations 0015 and 0012.

CREATE OR REPLACE FUNCTION ledgerflow.wf_end_node(
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
    v_limits  text[];
    v_claim   boolean := p_claim_token IS NOT NULL;
    v_due     timestamptz := clock_timestamp();
    v_version text;
BEGIN
    -- The log writer lock first (see ledgerflow.log_writer): the run-stream append that follows in this
    -- transaction then finds the stamp ready, where it would otherwise need a subtransaction for one.
    PERFORM ledgerflow.log_writer();
    IF p_retry_in IS NULL THEN
        DELETE FROM ledgerflow.workflow_queue q
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested, q.version INTO v_cancel, v_version;
    ELSE
        UPDATE ledgerflow.workflow_queue q
           SET status = 'ready', ready_at = clock_timestamp() + make_interval(secs => p_retry_in),
               token = NULL, worker_name = NULL, worker_instance = NULL, lease_expires_at = NULL
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested, q.version INTO v_cancel, v_version;
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
        IF v_claim THEN
            SELECT nl.limits INTO v_limits FROM ledgerflow.workflow_node_limits nl
             WHERE nl.workflow = p_workflow AND nl.node = p_ready[1];
            IF v_limits IS NOT NULL THEN
                -- The ending node's own slot is already free: its row changed above, in this transaction.
                SELECT g.admitted, coalesce(g.wake_at, clock_timestamp()) INTO v_claim, v_due
                  FROM ledgerflow.wf_limits_admit(array_fill(1, ARRAY[cardinality(v_limits)]), v_limits) g;
            END IF;
        END IF;
        WITH queued AS (
            INSERT INTO ledgerflow.workflow_queue AS q
                   (run_id, node, tenant, workflow, version, attempt, max_crashes, progress_deadline, on_stuck,
                    status, ready_at, token, worker_name, worker_instance, claimed_at, heartbeat_at,
                    progress_at, lease_expires_at)
            -- The ending node's version is its run's: the queue's version trigger need not read the log.
            SELECT p_run_id, u.node, p_tenant, p_workflow, v_version,
                   -- A successor refused a slot keeps the attempts so far: its claim counts the next one.
                   CASE WHEN u.n = 1 AND p_claim_token IS NOT NULL AND NOT u.claimed THEN u.attempt - 1
                        ELSE u.attempt END,
                   u.max_crashes, u.progress_deadline,
                   u.on_stuck, CASE WHEN u.claimed THEN 'claimed' ELSE 'ready' END,
                   CASE WHEN u.n = 1 THEN v_due ELSE clock_timestamp() END,
                   CASE WHEN u.claimed THEN p_claim_token END,
                   CASE WHEN u.claimed THEN p_worker_name END,
                   CASE WHEN u.claimed THEN p_instance END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() + make_interval(secs => p_ttl) END
              FROM (SELECT v.*, (v.n = 1 AND v_claim) AS claimed
                      FROM unnest(p_ready, p_attempts, p_max_crashes, p_progress_deadlines, p_on_stuck)
                           WITH ORDINALITY AS v(node, attempt, max_crashes, progress_deadline, on_stuck, n)) u
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

CREATE OR REPLACE FUNCTION ledgerflow.wf_suspend_node(
    p_run_id  uuid,
    p_node    text,
    p_token   bigint,
    p_until   timestamptz,
    p_now     boolean,
    p_signal  text
) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_cancel boolean;
BEGIN
    -- The log writer lock first (see ledgerflow.log_writer): the run-stream append that follows in this
    -- transaction then finds the stamp ready, where it would otherwise need a subtransaction for one.
    PERFORM ledgerflow.log_writer();
    UPDATE ledgerflow.workflow_queue q
       SET status = 'ready',
           ready_at = CASE WHEN p_now THEN clock_timestamp() ELSE coalesce(p_until, 'infinity') END,
           waiting_for = p_signal,
           token = NULL, worker_name = NULL, worker_instance = NULL, lease_expires_at = NULL
     WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
       AND q.lease_expires_at > clock_timestamp()
    RETURNING q.cancel_requested INTO v_cancel;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost' USING ERRCODE = 'LF004',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node, 'token', p_token)::text;
    END IF;
    IF v_cancel THEN
        RAISE EXCEPTION 'run cancelled' USING ERRCODE = 'LF005',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node)::text;
    END IF;
    RETURN now();
END
$$;

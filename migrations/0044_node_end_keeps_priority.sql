-- A node's end queues its successors with its run's priority.
--
-- The successors ledgerflow.wf_end_node queues took their run's version from the ending node's row
-- (migration 0023) but not its priority: the queue's priority trigger (migration 0028) read each one from
-- the run's RunStarted, a read of the log per successor, two per three-node run, on the hot path. The
-- ending node's row holds the run's priority (every row of a run has it: a start gives it, and every later
-- row is queued by an end like this one or takes it from the trigger), so the successors now take it from
-- there, as they take the version. A row without one (NULL) still goes through the trigger.
--
-- Otherwise as in migration 0034. Nothing changes in the order of the writes: the log writer lock first,
-- then the node's row (the fence), then the successors, then, in ledgerflow.wf_record_node_end, the
-- run-stream append; the queue's rows are locked before the run's stream row everywhere (claims, signals,
-- the sweep), and this keeps to that order.

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
    v_priority int;
BEGIN
    -- The log writer lock first (see ledgerflow.log_writer): the run-stream append that follows in this
    -- transaction then finds the stamp ready, where it would otherwise need a subtransaction for one.
    PERFORM ledgerflow.log_writer();
    IF p_retry_in IS NULL THEN
        DELETE FROM ledgerflow.workflow_queue q
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested, q.version, q.priority INTO v_cancel, v_version, v_priority;
    ELSE
        UPDATE ledgerflow.workflow_queue q
           SET status = 'ready', ready_at = clock_timestamp() + make_interval(secs => p_retry_in),
               token = NULL, worker_name = NULL, worker_instance = NULL, lease_expires_at = NULL
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested, q.version, q.priority INTO v_cancel, v_version, v_priority;
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
                   (run_id, node, tenant, workflow, version, priority, attempt, max_crashes, progress_deadline,
                    on_stuck, status, ready_at, token, worker_name, worker_instance, claimed_at, heartbeat_at,
                    progress_at, lease_expires_at)
            -- The ending node's version and priority are its run's: the queue's version and priority
            -- triggers need not read the log.
            SELECT p_run_id, u.node, p_tenant, p_workflow, v_version, v_priority,
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
               -- Evaluated once the existing row is locked: the claim's times are the grant's.
               SET status = excluded.status, ready_at = excluded.ready_at, token = excluded.token,
                   worker_name = excluded.worker_name, worker_instance = excluded.worker_instance,
                   claimed_at = CASE WHEN excluded.status = 'claimed' THEN clock_timestamp() END,
                   heartbeat_at = CASE WHEN excluded.status = 'claimed' THEN clock_timestamp() END,
                   progress_at = CASE WHEN excluded.status = 'claimed' THEN clock_timestamp() END,
                   lease_expires_at = CASE WHEN excluded.status = 'claimed'
                                           THEN clock_timestamp() + make_interval(secs => p_ttl) END,
                   attempt = excluded.attempt, cancel_requested = false
            RETURNING q.node, q.crashes
        )
        SELECT queued.crashes INTO v_crashes FROM queued WHERE queued.node = p_ready[1];
    END IF;
    RETURN QUERY SELECT coalesce(v_crashes, 0), now();
END
$$;

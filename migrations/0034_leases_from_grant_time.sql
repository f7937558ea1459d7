-- Leases last their TTL from the moment they are granted, and no longer.
--
-- A lease written by a statement that had to wait for its row was stamped from before the wait:
--   * a projection lease taken over with INSERT ... ON CONFLICT DO UPDATE SET expires_at =
--     excluded.expires_at got the expiry computed when the row was proposed, before the standby waited
--     behind the old holder's open batch (whose FOR SHARE keeps the lease from being taken): after a wait
--     of 4.86 s it got 0.14 s of a 5 s lease, and after a wait longer than the TTL a lease already lapsed;
--   * an UPDATE computes its new row, clock_timestamp() included, before it waits for a row lock, and when
--     the lock's holder only locked the row (a batch's FOR SHARE) or rolled back, it writes that row as
--     computed, without judging its WHERE again: a renewal (projection lease, node heartbeat) that waited
--     behind a batch got an expiry from before the wait, and one whose lease lapsed during the wait
--     renewed it anyway;
--   * a node's end that claims its successor, when the successor's row already exists (a node run again),
--     took the claim's times from the proposed row, computed before a wait for that row.
-- Now each of these locks its rows first, and then judges and stamps them by clock_timestamp() in a
-- statement of its own (or, in ON CONFLICT DO UPDATE, in the SET that PostgreSQL evaluates once the row
-- is locked). The claims (ledgerflow.wf_claim) and the sweep's reclaims (workflows/recovery.sql) already
-- stamp rows they locked with SKIP LOCKED, without waiting, and are unchanged.

-- A projection's lease for p_owner when it is free or lapsed, with a fresh epoch; NULL when it is held.
-- The lease row is locked before it is judged: a contender waits until the holder's batch commits, then
-- finds the lease as that batch left it, and a lease it takes runs p_ttl seconds from the take.
CREATE FUNCTION ledgerflow.projection_lease_acquire(p_projection text, p_owner text, p_ttl float8)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO ledgerflow.projection_leases AS l (projection, owner, epoch, acquired_at, heartbeat_at,
                                                   expires_at)
    VALUES (p_projection, p_owner, 1, clock_timestamp(), clock_timestamp(),
            clock_timestamp() + make_interval(secs => p_ttl))
    ON CONFLICT (projection) DO NOTHING
    RETURNING l.epoch INTO v_epoch;
    IF FOUND THEN
        RETURN v_epoch;
    END IF;
    PERFORM 1 FROM ledgerflow.projection_leases l WHERE l.projection = p_projection FOR UPDATE;
    UPDATE ledgerflow.projection_leases l
       SET owner = p_owner, epoch = l.epoch + 1, acquired_at = clock_timestamp(),
           heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + make_interval(secs => p_ttl)
     WHERE l.projection = p_projection AND l.expires_at < clock_timestamp()
    RETURNING l.epoch INTO v_epoch;
    RETURN v_epoch;
END
$$;

-- Renews a projection lease still held by (p_owner, p_epoch) for p_ttl seconds from now; false when it was
-- lost. Judged once the row is locked: a renewal that waited behind a batch does not bring back a lease
-- that lapsed meanwhile, nor stamp it from before the wait.
CREATE FUNCTION ledgerflow.projection_lease_renew(p_projection text, p_owner text, p_epoch bigint, p_ttl float8)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM ledgerflow.projection_leases l
     WHERE l.projection = p_projection AND l.owner = p_owner AND l.epoch = p_epoch
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE ledgerflow.projection_leases l
       SET heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + make_interval(secs => p_ttl)
     WHERE l.projection = p_projection AND l.owner = p_owner AND l.epoch = p_epoch
       AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END
$$;

-- A worker process's heartbeat: renews the leases of its claims p_tokens that still hold, p_ttl seconds
-- from now; returns the tokens renewed. The rows are locked first (in one order, so two renewals never
-- deadlock), waiting for the worker's own fenced writes to commit; then judged and stamped.
CREATE FUNCTION ledgerflow.wf_heartbeat(p_instance text, p_tokens bigint[], p_ttl float8)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM ledgerflow.workflow_queue q
     WHERE q.status = 'claimed' AND q.worker_instance = p_instance AND q.token = ANY (p_tokens)
     ORDER BY q.run_id, q.node
       FOR UPDATE;
    RETURN QUERY
        UPDATE ledgerflow.workflow_queue q
           SET heartbeat_at = clock_timestamp(), lease_expires_at = clock_timestamp() + make_interval(secs => p_ttl)
         WHERE q.status = 'claimed' AND q.worker_instance = p_instance AND q.token = ANY (p_tokens)
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.token;
END
$$;

-- As in 0023, except that a successor claimed over a row that already exists takes the claim's times
-- (claimed, heartbeat, progress, lease) from when that row is locked, not from the proposed row.
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

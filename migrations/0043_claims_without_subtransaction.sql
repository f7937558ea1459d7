-- A claim records its NodeClaimed events without a subtransaction.
--
-- A claim writes the queue first (the pick locks the ready rows, the claim updates them) and then appends
-- each claimed node's NodeClaimed (ledgerflow.wf_record_claims, migration 0026). By then the transaction
-- had an xid from before it held the log writer lock, so the append took the late path of
-- ledgerflow.log_writer (migration 0013): a subtransaction (a row inserted and rolled back in an EXCEPTION
-- block) whose xid served as the stamp. Every claim that claimed something paid it: a worker's claim loop,
-- and the first node of every run that is not claimed at another run's end. With the writer lock taken
-- before the first write the stamp is the transaction's own xid, handed out after the lock, as a node's
-- end has done since migration 0023 (ledgerflow.wf_end_node takes the lock first and appends in the same
-- statement, ledgerflow.wf_record_node_end: no subtransaction).
--
-- A claim cannot take the stamp at its start as a node's end does: ledgerflow.log_writer hands the
-- transaction its xid at once, and most claims of an idle worker find nothing; each would then write a
-- commit record. So the lock comes first and the xid only when the claim writes:
--   * ledgerflow.log_writer_early takes the lock while the transaction has no xid, and notes so in a
--     transaction-local setting; a transaction that already has a stamp or an xid is left as it is;
--   * ledgerflow.log_writer_stamp, where a transaction that took the lock early first needs its stamp,
--     takes its xid, handed out after the lock by construction, as the stamp; otherwise it is
--     ledgerflow.log_writer, late path included.
-- The lock is held from before the xid until the transaction ends, which is all the readers' horizon
-- (ledgerflow.log_holders) relies on. An idle claim holds it for one statement and has no xid, so no
-- reader ever waits for it.

-- The log writer lock before a statement's first write, without taking an xid (see above). True when
-- the transaction's later stamp may be its own xid.
CREATE FUNCTION ledgerflow.log_writer_early() RETURNS boolean
LANGUAGE sql AS $$
SELECT CASE
    WHEN current_setting('ledgerflow.log_writer_stamp', true) <> '' THEN true
    WHEN current_setting('ledgerflow.log_writer_early', true) = 'on' THEN true
    WHEN pg_current_xact_id_if_assigned() IS NULL
        THEN set_config('ledgerflow.log_writer_early',
                        CASE WHEN pg_advisory_xact_lock(1279675479, pg_backend_pid()) IS NULL THEN NULL
                             ELSE 'on' END,
                        true) = 'on'
    ELSE false
END
$$;

-- The calling transaction's stamp: its own xid when it took the log writer lock early (see above), else
-- that of ledgerflow.log_writer. CASE evaluates its branches in order.
CREATE FUNCTION ledgerflow.log_writer_stamp() RETURNS xid8
LANGUAGE sql AS $$
SELECT CASE
    WHEN current_setting('ledgerflow.log_writer_stamp', true) <> ''
        THEN current_setting('ledgerflow.log_writer_stamp', true)::xid8
    WHEN current_setting('ledgerflow.log_writer_early', true) = 'on'
        THEN set_config('ledgerflow.log_writer_stamp', pg_current_xact_id()::text, true)::xid8
    ELSE ledgerflow.log_writer()
END
$$;

-- As in migration 0026, stamped by ledgerflow.log_writer_stamp.
CREATE OR REPLACE FUNCTION ledgerflow.wf_record_claims(
    p_tenants   text[],
    p_run_ids   uuid[],
    p_nodes     text[],
    p_attempts  int[],
    p_tokens    bigint[],
    p_worker    text
) RETURNS TABLE (k bigint, stream_id text, stream_version bigint, "position" bigint, transaction_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_stamp    xid8;
    v_stream   text;
    v_version  bigint;
BEGIN
    IF cardinality(p_run_ids) = 0 THEN
        RETURN;
    END IF;
    v_stamp := ledgerflow.log_writer_stamp();
    FOR i IN 1 .. cardinality(p_run_ids) LOOP
        v_stream := 'wf-' || p_run_ids[i]::text;
        UPDATE ledgerflow.streams s SET version = s.version + 1
         WHERE s.tenant = p_tenants[i] AND s.stream_id = v_stream
        RETURNING s.version INTO v_version;
        IF v_version IS NULL THEN
            RAISE EXCEPTION 'run stream % of tenant % does not exist', v_stream, p_tenants[i];
        END IF;
        RETURN QUERY
            INSERT INTO ledgerflow.events AS e (transaction_id, tenant, stream_id, stream_version, event_id,
                                                event_type, data, correlation_id)
            VALUES (v_stamp, p_tenants[i], v_stream, v_version, gen_random_uuid(), 'wf.NodeClaimed',
                    jsonb_build_object('run_id', p_run_ids[i]::text, 'node', p_nodes[i],
                                       'attempt', p_attempts[i], 'token', p_tokens[i], 'worker', p_worker),
                    p_run_ids[i])
            RETURNING i::bigint, e.stream_id, e.stream_version, e.position, e.transaction_id::text::bigint;
    END LOOP;
END
$$;

-- As in migration 0028, with the log writer lock taken first (ledgerflow.log_writer_early).
CREATE OR REPLACE FUNCTION ledgerflow.wf_claim(
    p_worker_name  text,
    p_instance     text,
    p_worker_id    text,
    p_workflows    text[],
    p_versions     text[],
    p_limit        int,
    p_ttl          float8
) RETURNS TABLE (run_id uuid, node text, tenant text, workflow text, attempt int, token bigint,
                 cancel_requested boolean, crashes int, version text, stream_id text, stream_version bigint,
                 "position" bigint, transaction_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- Gap-freedom without a subtransaction: the log writer lock before the claim's first write (the pick
    -- locks rows, the claim updates them), while the transaction has no xid yet. The NodeClaimed events
    -- then carry the transaction's own xid (ledgerflow.log_writer_stamp), handed out after the lock. A
    -- claim that finds nothing holds the lock for this statement only and takes no xid.
    PERFORM ledgerflow.log_writer_early();
    -- As in migration 0027 (exactly one winner per node, a fresh fencing token, admission of nodes with
    -- limits, each claim's NodeClaimed appended), but the nodes are picked by ledgerflow.wf_claim_pick:
    -- tenants in turn, priorities within a tenant, bounded whatever the backlog.
    RETURN QUERY
    WITH picked AS (
        SELECT p.run_id, p.node, p.workflow, p.n
          FROM ledgerflow.wf_claim_pick(p_workflows, p_versions, p_limit) p
    ), needs AS (
        -- The limits each picked node needs: one index probe per node, nothing found when nothing has
        -- limits.
        SELECT p.n, unnest(nl.limits) AS key
          FROM picked p JOIN ledgerflow.workflow_node_limits nl ON nl.workflow = p.workflow AND nl.node = p.node
    ), refused AS (
        -- Admission, only when a picked node needs a slot: exact under concurrent claimers (an advisory
        -- lock per limit key until commit; see ledgerflow.wf_limits_admit).
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
           SET status = 'claimed', attempt = q.attempt + 1,
               token = nextval('ledgerflow.workflow_fencing_tokens'),
               worker_name = p_worker_name, worker_instance = p_instance, claimed_at = clock_timestamp(),
               heartbeat_at = clock_timestamp(), progress_at = clock_timestamp(),
               lease_expires_at = clock_timestamp() + make_interval(secs => p_ttl), waiting_for = NULL
          FROM picked
         WHERE q.run_id = picked.run_id AND q.node = picked.node
           AND picked.n NOT IN (SELECT candidate FROM refused)
        RETURNING q.run_id, q.node, q.tenant, q.workflow, q.attempt, q.token, q.cancel_requested, q.crashes,
                  q.version
    ), ordered AS (
        -- In the order the run streams are locked in (see ledgerflow.wf_record_claims).
        SELECT c.*, row_number() OVER (ORDER BY c.tenant, c.run_id, c.node) AS k FROM claimed c
    )
    SELECT o.run_id, o.node, o.tenant, o.workflow, o.attempt, o.token, o.cancel_requested, o.crashes,
           o.version, r.stream_id, r.stream_version, r.position, r.transaction_id
      FROM ordered o
      JOIN ledgerflow.wf_record_claims(ARRAY(SELECT tenant FROM ordered ORDER BY k),
                                       ARRAY(SELECT run_id FROM ordered ORDER BY k),
                                       ARRAY(SELECT node FROM ordered ORDER BY k),
                                       ARRAY(SELECT attempt FROM ordered ORDER BY k),
                                       ARRAY(SELECT token FROM ordered ORDER BY k), p_worker_id) r ON r.k = o.k
     ORDER BY o.k;
END
$$;

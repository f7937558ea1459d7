-- The end of a run in one statement, with the claim of a node of another run.
--
-- A node's end that finished its run was the last end sent as a pipelined transaction: BEGIN, the queue's
-- change, the claim of another run's node (so the worker goes on without a claim of its own), the append,
-- COMMIT: five executions for the client to prepare and two round trips. For a run without a key (one
-- with a key also releases it, in a stream of its own) it is now one statement: ledgerflow.wf_record_node_end
-- (the queue's change and the run-stream append, LF001 if the version does not hold) followed by the claim,
-- in one function, so in one transaction and one round trip, as before all or nothing. The statement also
-- reads the claimed run's stream, which the worker read with a statement of its own before it started the
-- run's node.
--
-- The claim statement moves here from the workflow package's queries, unchanged, as ledgerflow.wf_claim,
-- so that the claim loop and the run's end claim by one statement.

CREATE FUNCTION ledgerflow.wf_claim(
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
    -- Exactly one winner per node: SKIP LOCKED hands each ready row to one claimer, and the token, fresh
    -- from a sequence, fences every later write of this claim. Bounded whatever the backlog: for each of
    -- the worker's workflows, the walk of the ready index (workflow, version, ready_at) stops after p_limit
    -- unlocked rows (statement_timestamp(), unlike clock_timestamp(), can bound the index scan). Rows a
    -- workflow's walk locked beyond the overall limit stay unclaimed and are unlocked at commit.
    -- Nodes with limits (workflows/limits.py) are claimed only with a slot of each: see `refused`.
    -- Only nodes of runs started with a version the worker has: one walk per (workflow, version) it has.
    -- Each claim's NodeClaimed is appended to its run's stream here (ledgerflow.wf_record_claims).
    RETURN QUERY
    WITH picked AS (
        SELECT r.run_id, r.node, w.name AS workflow, row_number() OVER (ORDER BY r.ready_at)::int AS n
          FROM unnest(p_workflows, p_versions) AS w(name, version)
         CROSS JOIN LATERAL (
              SELECT q.run_id, q.node, q.ready_at FROM ledgerflow.workflow_queue q
               WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                 AND q.ready_at <= statement_timestamp()
               ORDER BY q.ready_at
               LIMIT p_limit
                 FOR UPDATE SKIP LOCKED
         ) r
         ORDER BY r.ready_at
         LIMIT p_limit
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

-- The rows: first the end's, one per event appended to the run's stream (run_id NULL); then, when a node of
-- another run was claimed (p_claim_workflows not empty), the claim with its NodeClaimed's append (event_id
-- NULL), and the first p_read_limit events of the claimed run's stream, in version order, the columns of
-- a stream read (event_id set): the worker starts the node it claimed without reading its run again.
CREATE FUNCTION ledgerflow.wf_record_run_end(
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
    p_ttl                 float8,
    p_stream_id           text,
    p_expected            bigint,
    p_event_ids           uuid[],
    p_types               text[],
    p_data                text[],
    p_metadata            text[],
    p_correlation_ids     uuid[],
    p_causation_ids       uuid[],
    p_claim_worker_name   text,
    p_claim_instance      text,
    p_claim_worker_id     text,
    p_claim_workflows     text[],
    p_claim_versions      text[],
    p_claim_ttl           float8,
    p_read_limit          int
) RETURNS TABLE (crashes int, recorded_at timestamptz, stream_id text, stream_version bigint,
                 "position" bigint, transaction_id bigint, run_id uuid, node text, tenant text, workflow text,
                 attempt int, token bigint, cancel_requested boolean, claim_crashes int, version text,
                 event_id uuid, event_type text, data text, metadata text, correlation_id uuid,
                 causation_id uuid, event_recorded_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_claim record;
BEGIN
    RETURN QUERY
        SELECT e.crashes, e.recorded_at, e.stream_id, e.stream_version, e.position, e.transaction_id,
               NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::int, NULL::bigint, NULL::boolean,
               NULL::int, NULL::text, NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::uuid,
               NULL::timestamptz
          FROM ledgerflow.wf_record_node_end(p_run_id, p_node, p_token, p_check_cancel, p_retry_in, p_tenant,
                                             p_workflow, p_ready, p_attempts, p_max_crashes,
                                             p_progress_deadlines, p_on_stuck, p_claim_token, p_worker_name,
                                             p_instance, p_ttl, p_stream_id, p_expected, p_event_ids, p_types,
                                             p_data, p_metadata, p_correlation_ids, p_causation_ids) e;
    IF cardinality(p_claim_workflows) = 0 THEN
        RETURN;
    END IF;
    SELECT * INTO v_claim
      FROM ledgerflow.wf_claim(p_claim_worker_name, p_claim_instance, p_claim_worker_id, p_claim_workflows,
                               p_claim_versions, 1, p_claim_ttl);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT NULL::int, NULL::timestamptz, v_claim.stream_id, v_claim.stream_version, v_claim.position,
               v_claim.transaction_id, v_claim.run_id, v_claim.node, v_claim.tenant, v_claim.workflow,
               v_claim.attempt, v_claim.token, v_claim.cancel_requested, v_claim.crashes, v_claim.version,
               NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::uuid, NULL::timestamptz;
    -- The claimed run's stream, as a stream read gives it (its NodeClaimed, just appended, included): this
    -- transaction holds the stream's row, so nothing else is appended to it meanwhile.
    RETURN QUERY
        SELECT NULL::int, NULL::timestamptz, e.stream_id, e.stream_version, e.position,
               e.transaction_id::text::bigint, v_claim.run_id, NULL::text, e.tenant, NULL::text, NULL::int,
               NULL::bigint, NULL::boolean, NULL::int, NULL::text, e.event_id, e.event_type, e.data::text,
               e.metadata::text, e.correlation_id, e.causation_id, e.recorded_at
          FROM ledgerflow.events e
         WHERE e.tenant = v_claim.tenant AND e.stream_id = 'wf-' || v_claim.run_id::text
         ORDER BY e.stream_version
         LIMIT p_read_limit;
END
$$;

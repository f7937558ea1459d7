-- The hand-over read of ledgerflow.wf_record_run_end starts from the claimed run's snapshot.
--
-- The end of a run that claims a node of another run in the same statement also read that run's stream
-- for the worker, from its first event: up to p_read_limit (5,000) events, signal payloads included, so the
-- statement's answer grew with the claimed run's history and with what was sent to it. It now returns the
-- run's snapshot (ledgerflow.workflow_run_snapshots, migrations/0030; kept recent by the workflow_tables
-- projection) and the events after it, a signal's payload left out (the fold keeps signals by version,
-- workflows/snapshots.py). The worker folds those onto the snapshot; when more than p_read_limit events
-- follow it, the worker loads the run itself before the node starts, as before.
--
-- Same signature and row kinds, plus one: a row with a run_id, no node and no event_id is the snapshot
-- (stream_version: its version; data: the state's JSON). It comes before the events, and only when the run
-- has a snapshot.

CREATE OR REPLACE FUNCTION ledgerflow.wf_record_run_end(
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
    v_after bigint := 0;
    v_state text;
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
    SELECT s.version, s.state::text INTO v_after, v_state
      FROM ledgerflow.workflow_run_snapshots s
     WHERE s.tenant = v_claim.tenant AND s.run_id = v_claim.run_id;
    IF FOUND THEN
        RETURN QUERY
            SELECT NULL::int, NULL::timestamptz, 'wf-' || v_claim.run_id::text, v_after, NULL::bigint,
                   NULL::bigint, v_claim.run_id, NULL::text, v_claim.tenant, NULL::text, NULL::int,
                   NULL::bigint, NULL::boolean, NULL::int, NULL::text, NULL::uuid, NULL::text, v_state,
                   NULL::text, NULL::uuid, NULL::uuid, NULL::timestamptz;
    ELSE
        v_after := 0;
    END IF;
    -- The claimed run's stream after the snapshot, as a stream read gives it (its NodeClaimed, just
    -- appended, included; a signal without its payload): this transaction holds the stream's row, so
    -- nothing else is appended to it meanwhile.
    RETURN QUERY
        SELECT NULL::int, NULL::timestamptz, e.stream_id, e.stream_version, e.position,
               e.transaction_id::text::bigint, v_claim.run_id, NULL::text, e.tenant, NULL::text, NULL::int,
               NULL::bigint, NULL::boolean, NULL::int, NULL::text, e.event_id, e.event_type,
               CASE WHEN e.event_type = 'wf.SignalReceived' THEN (e.data - 'payload')::text
                    ELSE e.data::text END,
               e.metadata::text, e.correlation_id, e.causation_id, e.recorded_at
          FROM ledgerflow.events e
         WHERE e.tenant = v_claim.tenant AND e.stream_id = 'wf-' || v_claim.run_id::text
           AND e.stream_version > v_after
         ORDER BY e.stream_version
         LIMIT p_read_limit;
END
$$;

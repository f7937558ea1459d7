-- A node's end in one statement: the queue's side (ledgerflow.wf_end_node) and the run-stream events that
-- record it, for the commonest end, one that does not end its run.
--
-- The worker sent the two in a pipelined transaction: BEGIN, wf_end_node, the append, COMMIT, in two round
-- trips (the append's answer, then the commit). As one statement in autocommit they are one round trip,
-- one transaction that needs no BEGIN or COMMIT of its own, and one execution for the client to prepare.
-- Ends that finish their run keep the transaction: they also release the run's key and claim a node of
-- another run, which needs the first answers.
--
-- The append is the one-stream append of the event log (see append_one_stream in eventstore's queries):
-- the stream row moves by the number of events only at the version the worker knows, under its row lock;
-- if the version does not hold, the statement fails with the log's own wrong-version error (LF001), and
-- nothing of it is kept, queue changes included. The log writer lock is taken by wf_end_node before its
-- first write (migration 0023), so the events carry the transaction's stamp.

CREATE FUNCTION ledgerflow.wf_record_node_end(
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
    p_causation_ids       uuid[]
) RETURNS TABLE (crashes int, recorded_at timestamptz, stream_id text, stream_version bigint,
                 "position" bigint, transaction_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_crashes  int;
    v_at       timestamptz;
    v_stamp    xid8;
    v_count    int := cardinality(p_event_ids);
    v_base     bigint;
    v_actual   bigint;
BEGIN
    SELECT e.crashes, e.recorded_at INTO v_crashes, v_at
      FROM ledgerflow.wf_end_node(p_run_id, p_node, p_token, p_check_cancel, p_retry_in, p_tenant, p_workflow,
                                  p_ready, p_attempts, p_max_crashes, p_progress_deadlines, p_on_stuck,
                                  p_claim_token, p_worker_name, p_instance, p_ttl) e;
    v_stamp := ledgerflow.log_writer();

    UPDATE ledgerflow.streams s SET version = s.version + v_count
     WHERE s.tenant = p_tenant AND s.stream_id = p_stream_id AND s.version = p_expected
    RETURNING s.version - v_count INTO v_base;
    IF v_base IS NULL THEN
        SELECT s.version INTO v_actual FROM ledgerflow.streams s
         WHERE s.tenant = p_tenant AND s.stream_id = p_stream_id;
        RAISE EXCEPTION 'wrong expected version'
            USING ERRCODE = 'LF001',
                  DETAIL = json_build_object('tenant', p_tenant, 'stream_id', p_stream_id,
                                             'expected', p_expected, 'actual', v_actual)::text;
    END IF;

    RETURN QUERY
        WITH inserted AS (
            INSERT INTO ledgerflow.events AS e (transaction_id, tenant, stream_id, stream_version, event_id,
                                                event_type, data, metadata, correlation_id, causation_id)
            SELECT v_stamp, p_tenant, p_stream_id, v_base + u.n, u.event_id, u.event_type, u.data::jsonb,
                   u.metadata::jsonb, u.correlation_id, u.causation_id
              FROM unnest(p_event_ids, p_types, p_data, p_metadata, p_correlation_ids, p_causation_ids)
                   WITH ORDINALITY AS u(event_id, event_type, data, metadata, correlation_id, causation_id, n)
             ORDER BY u.n
            RETURNING e.stream_id, e.stream_version, e.position, e.transaction_id
        )
        SELECT v_crashes, v_at, i.stream_id, i.stream_version, i.position, i.transaction_id::text::bigint
          FROM inserted i
         ORDER BY i.position;
END
$$;

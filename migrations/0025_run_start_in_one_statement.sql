-- A run's start in one statement: its first events (RunStarted, NodesReady) on a new run stream, and its
-- first nodes queued, for the commonest start, one without a run key or an idempotency key.
--
-- The engine sent them in a pipelined transaction: BEGIN, the append, the queue's insert, COMMIT, in two
-- round trips. As one statement in autocommit they are one round trip and one transaction with no BEGIN
-- or COMMIT of its own. Starts with a key (the key stream is appended to as well) or an idempotency key
-- keep the transaction.
--
-- The append is the log's one-stream append with "no stream" expected: if the stream exists, the
-- statement fails with the log's own wrong-version error (LF001) and nothing of it is kept. The log
-- writer lock comes first (see ledgerflow.log_writer), so the events carry the transaction's stamp. The
-- queue rows are the `enqueue` statement's (workflows' queries), for a run that has none yet.

CREATE FUNCTION ledgerflow.wf_start_run(
    p_tenant              text,
    p_stream_id           text,
    p_event_ids           uuid[],
    p_types               text[],
    p_data                text[],
    p_metadata            text[],
    p_correlation_ids     uuid[],
    p_causation_ids       uuid[],
    p_run_id              uuid,
    p_workflow            text,
    p_version             text,
    p_nodes               text[],
    p_max_crashes         int[],
    p_progress_deadlines  float8[],
    p_on_stuck            text[]
) RETURNS TABLE (stream_id text, stream_version bigint, "position" bigint, transaction_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_stamp   xid8 := ledgerflow.log_writer();
    v_count   int := cardinality(p_event_ids);
    v_actual  bigint;
BEGIN
    INSERT INTO ledgerflow.streams (tenant, stream_id, version)
    VALUES (p_tenant, p_stream_id, v_count)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        SELECT s.version INTO v_actual FROM ledgerflow.streams s
         WHERE s.tenant = p_tenant AND s.stream_id = p_stream_id;
        RAISE EXCEPTION 'wrong expected version'
            USING ERRCODE = 'LF001',
                  DETAIL = json_build_object('tenant', p_tenant, 'stream_id', p_stream_id,
                                             'expected', -2, 'actual', v_actual)::text;
    END IF;

    INSERT INTO ledgerflow.workflow_queue
           (run_id, node, tenant, workflow, version, attempt, max_crashes, progress_deadline, on_stuck, ready_at)
    SELECT p_run_id, u.node, p_tenant, p_workflow, p_version, 0, u.max_crashes, u.progress_deadline,
           u.on_stuck, clock_timestamp()
      FROM unnest(p_nodes, p_max_crashes, p_progress_deadlines, p_on_stuck)
           AS u(node, max_crashes, progress_deadline, on_stuck);

    RETURN QUERY
        WITH inserted AS (
            INSERT INTO ledgerflow.events AS e (transaction_id, tenant, stream_id, stream_version, event_id,
                                                event_type, data, metadata, correlation_id, causation_id)
            SELECT v_stamp, p_tenant, p_stream_id, u.n, u.event_id, u.event_type, u.data::jsonb,
                   u.metadata::jsonb, u.correlation_id, u.causation_id
              FROM unnest(p_event_ids, p_types, p_data, p_metadata, p_correlation_ids, p_causation_ids)
                   WITH ORDINALITY AS u(event_id, event_type, data, metadata, correlation_id, causation_id, n)
             ORDER BY u.n
            RETURNING e.stream_id, e.stream_version, e.position, e.transaction_id
        )
        SELECT i.stream_id, i.stream_version, i.position, i.transaction_id::text::bigint
          FROM inserted i
         ORDER BY i.position;
END
$$;

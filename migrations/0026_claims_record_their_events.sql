-- A claim records its NodeClaimed events in the same statement.
--
-- The worker claimed in a pipelined transaction: BEGIN and the claim, then, with the claims in hand, the
-- NodeClaimed appends built in Python, then COMMIT: three round trips. The claim statement now ends with a
-- call of this function, which appends one NodeClaimed per claimed node to its run's stream, so a claim is
-- one statement in autocommit: one round trip, one transaction.
--
-- The events are the ones `workflows.lifecycle.claimed_event` builds (run id, node, attempt, token,
-- worker; the run id also as correlation id), as its model `workflows.events.NodeClaimed` checks them; a
-- test compares the two. The streams are moved in (tenant, stream id) order, the order every multi-stream
-- append locks them in. Nothing claimed, nothing written: the log writer lock is taken only when there is
-- something to record (its late path, since the claim's queue change came first; see ledgerflow.log_writer).

CREATE FUNCTION ledgerflow.wf_record_claims(
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
    v_stamp := ledgerflow.log_writer();
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

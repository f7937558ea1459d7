-- A node that waits (a timer, a signal) and wakes goes on with the same attempt: its wake is not a new
-- try. The claim counts every claim as an attempt (wf_claim: attempt = attempt + 1), so the suspension
-- takes one back, and the wake's claim brings the row to the attempt it left. Attempts then count tries
-- (first run, retries, takeovers after a crash); the run's state counts wakes apart (NodeState.wakes).
-- Unchanged otherwise (0023).
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
           attempt = q.attempt - 1,
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

-- Nodes that wait (durable timers, signals): a waiting node is a ready row of the queue that is due later,
-- so it holds no worker, no thread and no connection, and any worker claims it when it is due, also after
-- every worker restarted. A timer is due at its time; a signal wait at its timeout (infinity without one),
-- or at once when its signal arrives: `waiting_for` names the signal, so that sending it can wake the node.
ALTER TABLE ledgerflow.workflow_queue ADD COLUMN waiting_for text;

-- A node suspends itself: under the fence of ledgerflow.wf_end_node (the caller's claim must still hold
-- the node: LF004 otherwise; LF005 if the run is being cancelled), its row becomes ready at p_until
-- (NULL: never on its own; p_now: at once, because what it waits for already came), with no claim.
-- Returns the transaction's timestamp, the recorded_at of the NodeWaiting event appended with it.
CREATE FUNCTION ledgerflow.wf_suspend_node(
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

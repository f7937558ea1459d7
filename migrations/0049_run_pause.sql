-- Pausing a run: a paused run starts no new node until it is resumed.
--
-- A run is paused while it has a row in workflow_paused_runs, written in the transaction that appends its
-- RunPaused event and deleted in the one that appends its RunResumed (or its cancellation): like the
-- queue, operational state beside the log that changes only with the run-stream event that causes it.
--
-- The pause moves the run's ready rows (due or waiting for a timer or a signal) to the status `paused`,
-- which keeps their place (ready_at, attempt, crashes, waiting_for) and takes them out of the claims' ready
-- index; the resume moves them back. Rows that become ready while the run is paused (a running node's
-- successors or retry, a node taken back from a dead worker) are not touched where they are written, so
-- that no node end pays for pauses: the claim below finds them, moves them to `paused` and hands out none
-- of them. So a paused run's row is handed out by no claim, and each is walked by at most one.

CREATE TABLE ledgerflow.workflow_paused_runs (
    run_id     uuid        PRIMARY KEY,
    tenant     text        NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

ALTER TABLE ledgerflow.workflow_queue DROP CONSTRAINT workflow_queue_status_check;
ALTER TABLE ledgerflow.workflow_queue
    ADD CONSTRAINT workflow_queue_status_check CHECK (status IN ('ready', 'claimed', 'parked', 'paused'));

-- Whether the run is paused, read with a snapshot of its own (VOLATILE: each call looks again), taken
-- when it is called, not when the calling statement began. A claim or a reclaim asks only once it holds
-- the node's row lock; a pause or a resume of that run first locks every row of the run (see
-- `lock_run_nodes`), so one that committed before the lock was taken is seen, and none is in flight. The
-- statement's own snapshot could be older than a resume that committed meanwhile, and would hold a
-- resumed run's node back for good.
CREATE FUNCTION ledgerflow.wf_run_paused(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM ledgerflow.workflow_paused_runs pr WHERE pr.run_id = p_run_id);
END
$$;

-- The claim of migration 0028, with the rows of paused runs left out: those it picked move to `paused`
-- (out of the ready index: no later claim walks them again) and are neither admitted nor claimed.
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
    -- Gap-freedom without a subtransaction, as in migration 0043: the log writer lock before the claim's
    -- first write, while the transaction has no xid yet; NodeClaimed then carries the transaction's own xid.
    PERFORM ledgerflow.log_writer_early();
    RETURN QUERY
    WITH picked_all AS (
        -- (The pick runs to its end, its rows locked, before the first wf_run_paused call.)
        SELECT p.run_id, p.node, p.workflow, p.n, ledgerflow.wf_run_paused(p.run_id) AS paused
          FROM ledgerflow.wf_claim_pick(p_workflows, p_versions, p_limit) p
    ), held AS (
        -- A paused run starts no new node. The picked rows are locked (FOR UPDATE in the pick), and a pause
        -- locks every row of its run before it writes its row: a row picked before the pause committed is
        -- claimed before it (the pause then finds it running), one picked after it is held.
        UPDATE ledgerflow.workflow_queue q SET status = 'paused'
          FROM picked_all p
         WHERE p.paused AND q.run_id = p.run_id AND q.node = p.node
    ), picked AS (
        SELECT p.run_id, p.node, p.workflow, p.n FROM picked_all p WHERE NOT p.paused
    ), needs AS (
        SELECT p.n, unnest(nl.limits) AS key
          FROM picked p JOIN ledgerflow.workflow_node_limits nl ON nl.workflow = p.workflow AND nl.node = p.node
    ), refused AS (
        SELECT g.candidate, g.wake_at
          FROM (SELECT WHERE EXISTS (SELECT FROM needs)) AS some_needs
         CROSS JOIN LATERAL ledgerflow.wf_limits_admit(ARRAY(SELECT n FROM needs ORDER BY n, key),
                                                       ARRAY(SELECT key FROM needs ORDER BY n, key)) g
         WHERE NOT g.admitted
    ), deferred AS (
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

-- A claim plans its statements once per session, not once per call, and finds the rows it picked by key.
--
-- PL/pgSQL keeps a prepared plan per statement for the session, but PostgreSQL's plan cache first makes
-- five custom plans (planned for the call's values) and keeps making them while the generic plan's estimate
-- looks worse than theirs. The claim's statements compare the queue's index with their parameters (the
-- next tenant after `p_after`, a tenant's rows due by now, a limit of `v_share`): with the values known,
-- the estimates are always smaller, so every call was planned again. Planning the pick's first round took
-- about 2 ms of server CPU, more than running it; a worker pays one claim per run at least (a run's first
-- node, and the claim of another run's node at a run's end), so the claim was the largest server cost of
-- a three-node workflow (bench/results/workflows-cpu-*.json).
--
-- The generic plans are the index-driven plans the claim is written for (one probe per tenant, a range
-- scan of one tenant's due rows that stops at its share; EXPLAIN of the generic plans: index scans of
-- workflow_queue_ready_fair only), so forcing them changes no result, no lock and no order: only the
-- planning is gone. The setting holds for the call of ledgerflow.wf_claim and all it calls (the pick, its
-- walks and shares: nothing else calls them), and is restored when it returns; the caller's own statements
-- are planned as before.

ALTER FUNCTION ledgerflow.wf_claim(text, text, text, text[], text[], int, float8)
    SET plan_cache_mode = force_generic_plan;

-- The pick returns at most the claim's limit (a worker's free node threads, a handful), but a set-returning
-- function is estimated at 1,000 rows unless told otherwise: for 1,000 picked rows the planner joined them
-- to the queue by a hash join over a sequential scan of the whole queue, in the claim's UPDATE, on every
-- claim (EXPLAIN ANALYZE with 2,500 rows queued: 1.2 ms for that scan alone, growing with the backlog).
-- Estimated at 10, each picked row is found by the queue's primary key (a nested loop of index probes).
ALTER FUNCTION ledgerflow.wf_claim_pick(text[], text[], int) ROWS 10;

-- A claim finds the queue rows it picked by their primary key, whatever the queue's statistics say.
--
-- Migration 0080 made the claim keep generic plans and estimated its pick at 10 rows, so that the UPDATE
-- that marks the picked rows claimed probes workflow_queue_pkey once per picked row. But a plan is made
-- against the queue as it was at that moment, and a queue changes faster than autovacuum reads it: in a
-- database whose queue held a few rows when the session first claimed (a new deployment, a quiet
-- moment before a burst), the planner estimated the queue at 200 rows and joined the picked rows to it
-- by a hash join over a sequential scan of the whole queue. That plan is kept until autovacuum analyses
-- the queue again, up to a minute later, and every claim meanwhile reads every queued row, live and dead:
-- with 500 runs started at once (bench/workflows.py), 838 of the 939 claims that took over a millisecond
-- scanned the queue, up to 106 live rows and their dead versions each; with a backlog of 100,000 runs
-- each claim would read them all.
--
-- Every statement of a claim is written to be driven by the queue's indexes (probes per tenant and
-- workflow, a range of one tenant's due rows, the picked rows by key), so the planner is told to keep to
-- them: no sequential scan where an index serves, and joins as nested loops of index probes. The settings
-- hold for the call of ledgerflow.wf_claim and all it calls (nothing else calls the pick and its helpers),
-- as plan_cache_mode does since 0080; the results, locks and order of a claim are unchanged.

ALTER FUNCTION ledgerflow.wf_claim(text, text, text, text[], text[], int, float8)
    SET enable_seqscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off;

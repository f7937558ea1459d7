-- Limits per key, shared by every worker on every host: `registry.limit("llm", concurrency=4,
-- per_minute=60)` in code, `@flow.node(limits=["llm"])` on the nodes that need a slot. Declared in code,
-- enforced here: each worker writes its registry's limits at start (the last to start wins, and says so
-- in its log), and every claim of a node with limits is admitted by ledgerflow.wf_limits_admit.
--
-- A slot in use is a claimed queue row of a node with that limit: nothing else records it. Every way a
-- node stops running (success, failure, retry, cancel, release, suspension, reclaim of a crashed or
-- lapsed claim, a stuck node taken back) changes or deletes that row, and so frees the slot by itself;
-- a reclaim hands the row on still claimed, so the slot passes to the new holder without being counted
-- twice. A node waiting for a slot is a ready row, due a little later: it holds no thread and no
-- connection.

CREATE TABLE ledgerflow.workflow_limits (
    name         text        PRIMARY KEY,
    -- NULL: no bound of that kind.
    concurrency  integer     CHECK (concurrency >= 1),
    per_minute   integer     CHECK (per_minute >= 1),
    declared_by  text        NOT NULL,
    declared_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The limits each node of each workflow needs, as its workers declared them. A node not listed has none,
-- so the claim of a workflow without limits finds no row here and pays one index probe per claimed node.
CREATE TABLE ledgerflow.workflow_node_limits (
    workflow  text   NOT NULL,
    node      text   NOT NULL,
    limits    text[] NOT NULL CHECK (cardinality(limits) > 0),
    PRIMARY KEY (workflow, node)
);

-- Starts of nodes under a per-minute limit, one row per limit and start; rows older than a minute are
-- pruned by the admission that next looks at that limit.
CREATE TABLE ledgerflow.workflow_limit_starts (
    name        text        NOT NULL,
    started_at  timestamptz NOT NULL
);
CREATE INDEX workflow_limit_starts_by_name ON ledgerflow.workflow_limit_starts (name, started_at);

-- Admission of claims that need slots. p_candidates[i] is a candidate's number and p_keys[i] one limit it
-- needs (a candidate with two limits appears twice); candidates are admitted in ascending number (the
-- claim numbers them in ready order). Returns, for each candidate, whether it was admitted and, if not,
-- when to look at it again.
--
-- Exact under concurrent claimers: a transaction-level advisory lock per limit key (taken in key order,
-- so two admissions never wait on each other in a cycle) serialises every admission of that key until
-- the admitting transaction commits or rolls back. The counts are read after the lock is granted, each
-- statement here with a fresh snapshot, so they include every earlier admission, which has committed by
-- then; admissions within this call are counted as they are made. Slots freed concurrently can only make
-- the counts read too high, never too low: a node may wait a moment longer, never exceed its limit.
CREATE FUNCTION ledgerflow.wf_limits_admit(p_candidates int[], p_keys text[])
RETURNS TABLE (candidate int, admitted boolean, wake_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_keys     text[];
    v_conc     int[];
    v_rate     int[];
    v_used     int[];
    v_started  int[];
    v_oldest   timestamptz[];
    v_key      text;
    v_cap      int;
    v_per_min  int;
    v_i        int;
    v_c        int;
    v_ok       boolean;
    v_wake     timestamptz;
    v_needs    text[];
BEGIN
    SELECT array_agg(DISTINCT k ORDER BY k) INTO v_keys FROM unnest(p_keys) AS k;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    -- 1279677773 ("LFLM") names the limit locks; the key's hash picks the lock. Two keys that share a
    -- hash share a lock: they then admit one after the other, which is slower, never wrong.
    FOREACH v_key IN ARRAY v_keys LOOP
        PERFORM pg_advisory_xact_lock(1279677773, hashtext(v_key));
    END LOOP;
    v_conc := '{}'; v_rate := '{}'; v_used := '{}'; v_started := '{}'; v_oldest := '{}';
    FOREACH v_key IN ARRAY v_keys LOOP
        -- A key no worker declared has no bound (the worker that declares a node's limits declares them).
        SELECT l.concurrency, l.per_minute INTO v_cap, v_per_min
          FROM ledgerflow.workflow_limits l WHERE l.name = v_key;
        v_conc := v_conc || v_cap;
        v_rate := v_rate || v_per_min;
        v_used := v_used || (
            SELECT count(*)::int FROM ledgerflow.workflow_queue q
              JOIN ledgerflow.workflow_node_limits nl ON nl.workflow = q.workflow AND nl.node = q.node
             WHERE q.status = 'claimed' AND v_key = ANY (nl.limits));
        IF v_per_min IS NOT NULL THEN
            DELETE FROM ledgerflow.workflow_limit_starts s
             WHERE s.name = v_key AND s.started_at <= clock_timestamp() - interval '1 minute';
        END IF;
        v_started := v_started || (
            SELECT count(*)::int FROM ledgerflow.workflow_limit_starts s WHERE s.name = v_key);
        v_oldest := v_oldest || (
            SELECT min(s.started_at) FROM ledgerflow.workflow_limit_starts s WHERE s.name = v_key);
    END LOOP;

    FOR v_c IN SELECT DISTINCT c FROM unnest(p_candidates) AS c ORDER BY c LOOP
        SELECT array_agg(p_keys[i]) INTO v_needs
          FROM generate_subscripts(p_candidates, 1) AS i WHERE p_candidates[i] = v_c;
        v_ok := true;
        v_wake := NULL;
        FOREACH v_key IN ARRAY v_needs LOOP
            v_i := array_position(v_keys, v_key);
            IF v_conc[v_i] IS NOT NULL AND v_used[v_i] >= v_conc[v_i] THEN
                -- A slot frees when a node ends, which no clock foretells: look again shortly (an end
                -- also wakes every worker, but this row is due only from then on).
                v_ok := false;
                v_wake := greatest(v_wake, clock_timestamp() + interval '200 milliseconds');
            END IF;
            IF v_rate[v_i] IS NOT NULL AND v_started[v_i] >= v_rate[v_i] THEN
                -- The window frees a start when its oldest start is a minute old.
                v_ok := false;
                v_wake := greatest(v_wake, coalesce(v_oldest[v_i] + interval '1 minute', clock_timestamp()));
            END IF;
        END LOOP;
        IF v_ok THEN
            FOREACH v_key IN ARRAY v_needs LOOP
                v_i := array_position(v_keys, v_key);
                v_used[v_i] := v_used[v_i] + 1;
                IF v_rate[v_i] IS NOT NULL THEN
                    v_started[v_i] := v_started[v_i] + 1;
                    v_oldest[v_i] := coalesce(v_oldest[v_i], clock_timestamp());
                    INSERT INTO ledgerflow.workflow_limit_starts (name, started_at)
                    VALUES (v_key, clock_timestamp());
                END IF;
            END LOOP;
        END IF;
        candidate := v_c;
        admitted := v_ok;
        wake_at := v_wake;
        RETURN NEXT;
    END LOOP;
END
$$;

-- A node's end hands its first newly runnable node to the finishing worker, already claimed (see
-- migrations/0009_workflow_hot_path.sql). That claim needs slots too: a successor with limits is admitted
-- here like any claim; one that gets no slot is queued ready (due when wf_limits_admit says) instead of
-- claimed, and the worker that expected it finds, at the node's start, that it does not hold it (see
-- workflows/limits.py). Everything else is as in 0009.
CREATE OR REPLACE FUNCTION ledgerflow.wf_end_node(
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
    p_ttl                 float8
) RETURNS TABLE (crashes int, recorded_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_cancel  boolean;
    v_crashes int;
    v_limits  text[];
    v_claim   boolean := p_claim_token IS NOT NULL;
    v_due     timestamptz := clock_timestamp();
BEGIN
    IF p_retry_in IS NULL THEN
        DELETE FROM ledgerflow.workflow_queue q
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested INTO v_cancel;
    ELSE
        UPDATE ledgerflow.workflow_queue q
           SET status = 'ready', ready_at = clock_timestamp() + make_interval(secs => p_retry_in),
               token = NULL, worker_name = NULL, worker_instance = NULL, lease_expires_at = NULL
         WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
           AND q.lease_expires_at > clock_timestamp()
        RETURNING q.cancel_requested INTO v_cancel;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost' USING ERRCODE = 'LF004',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node, 'token', p_token)::text;
    END IF;
    IF p_check_cancel AND v_cancel THEN
        RAISE EXCEPTION 'run cancelled' USING ERRCODE = 'LF005',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node)::text;
    END IF;

    IF cardinality(p_ready) > 0 THEN
        IF v_claim THEN
            SELECT nl.limits INTO v_limits FROM ledgerflow.workflow_node_limits nl
             WHERE nl.workflow = p_workflow AND nl.node = p_ready[1];
            IF v_limits IS NOT NULL THEN
                -- The ending node's own slot is already free: its row changed above, in this transaction.
                SELECT g.admitted, coalesce(g.wake_at, clock_timestamp()) INTO v_claim, v_due
                  FROM ledgerflow.wf_limits_admit(array_fill(1, ARRAY[cardinality(v_limits)]), v_limits) g;
            END IF;
        END IF;
        WITH queued AS (
            INSERT INTO ledgerflow.workflow_queue AS q
                   (run_id, node, tenant, workflow, attempt, max_crashes, progress_deadline, on_stuck, status,
                    ready_at, token, worker_name, worker_instance, claimed_at, heartbeat_at, progress_at,
                    lease_expires_at)
            SELECT p_run_id, u.node, p_tenant, p_workflow,
                   -- A successor refused a slot keeps the attempts so far: its claim counts the next one.
                   CASE WHEN u.n = 1 AND p_claim_token IS NOT NULL AND NOT u.claimed THEN u.attempt - 1
                        ELSE u.attempt END,
                   u.max_crashes, u.progress_deadline,
                   u.on_stuck, CASE WHEN u.claimed THEN 'claimed' ELSE 'ready' END,
                   CASE WHEN u.n = 1 THEN v_due ELSE clock_timestamp() END,
                   CASE WHEN u.claimed THEN p_claim_token END,
                   CASE WHEN u.claimed THEN p_worker_name END,
                   CASE WHEN u.claimed THEN p_instance END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() END,
                   CASE WHEN u.claimed THEN clock_timestamp() + make_interval(secs => p_ttl) END
              FROM (SELECT v.*, (v.n = 1 AND v_claim) AS claimed
                      FROM unnest(p_ready, p_attempts, p_max_crashes, p_progress_deadlines, p_on_stuck)
                           WITH ORDINALITY AS v(node, attempt, max_crashes, progress_deadline, on_stuck, n)) u
            ON CONFLICT (run_id, node) DO UPDATE
               SET status = excluded.status, ready_at = excluded.ready_at, token = excluded.token,
                   worker_name = excluded.worker_name, worker_instance = excluded.worker_instance,
                   claimed_at = excluded.claimed_at, heartbeat_at = excluded.heartbeat_at,
                   progress_at = excluded.progress_at, lease_expires_at = excluded.lease_expires_at,
                   attempt = excluded.attempt, cancel_requested = false
            RETURNING q.node, q.crashes
        )
        SELECT queued.crashes INTO v_crashes FROM queued WHERE queued.node = p_ready[1];
    END IF;
    RETURN QUERY SELECT coalesce(v_crashes, 0), now();
END
$$;

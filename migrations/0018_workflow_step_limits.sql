-- Limits on steps: `ctx.step(key, fn, limits=["llm"])` runs `fn` only with a slot of each limit, held by a
-- row here from its admission until the step's result is recorded. A hold counts only while the claim
-- that took it is its node's current claim: once the node ends, is handed back or taken over (its row
-- goes, or gets a new token), the hold stops counting by itself, even if its worker died holding it.
CREATE TABLE ledgerflow.workflow_limit_holds (
    name     text   NOT NULL,
    run_id   uuid   NOT NULL,
    node     text   NOT NULL,
    token    bigint NOT NULL,
    PRIMARY KEY (name, run_id, node, token)
);

-- Slots of a limit in use: claimed nodes that need it, and steps holding it under a current claim.
CREATE FUNCTION ledgerflow.wf_limit_in_use(p_key text) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM ledgerflow.workflow_queue q
              JOIN ledgerflow.workflow_node_limits nl ON nl.workflow = q.workflow AND nl.node = q.node
             WHERE q.status = 'claimed' AND p_key = ANY (nl.limits))::int
         + (SELECT count(*) FROM ledgerflow.workflow_limit_holds h
              JOIN ledgerflow.workflow_queue q ON q.run_id = h.run_id AND q.node = h.node AND q.token = h.token
             WHERE h.name = p_key AND q.status = 'claimed')::int
$$;

-- As in 0015, with the slots in use counted by ledgerflow.wf_limit_in_use (steps' holds included), and
-- the holds of claims that ended pruned under the key's lock.
CREATE OR REPLACE FUNCTION ledgerflow.wf_limits_admit(p_candidates int[], p_keys text[])
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
    FOREACH v_key IN ARRAY v_keys LOOP
        PERFORM pg_advisory_xact_lock(1279677773, hashtext(v_key));
    END LOOP;
    v_conc := '{}'; v_rate := '{}'; v_used := '{}'; v_started := '{}'; v_oldest := '{}';
    FOREACH v_key IN ARRAY v_keys LOOP
        SELECT l.concurrency, l.per_minute INTO v_cap, v_per_min
          FROM ledgerflow.workflow_limits l WHERE l.name = v_key;
        v_conc := v_conc || v_cap;
        v_rate := v_rate || v_per_min;
        DELETE FROM ledgerflow.workflow_limit_holds h
         WHERE h.name = v_key
           AND NOT EXISTS (SELECT FROM ledgerflow.workflow_queue q
                            WHERE q.run_id = h.run_id AND q.node = h.node AND q.token = h.token
                              AND q.status = 'claimed');
        v_used := v_used || ledgerflow.wf_limit_in_use(v_key);
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
                v_ok := false;
                v_wake := greatest(v_wake, clock_timestamp() + interval '200 milliseconds');
            END IF;
            IF v_rate[v_i] IS NOT NULL AND v_started[v_i] >= v_rate[v_i] THEN
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

-- A step asks for slots of p_keys under its node's claim (LF004 unless the claim still holds the node).
-- Admitted: a hold per key, committed with this transaction, until the step ends (or its claim does).
-- Refused: nothing held, and when to ask again.
CREATE FUNCTION ledgerflow.wf_limits_hold(p_run_id uuid, p_node text, p_token bigint, p_keys text[])
RETURNS TABLE (admitted boolean, wake_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_admitted boolean;
    v_wake     timestamptz;
BEGIN
    PERFORM ledgerflow.wf_fence(p_run_id, p_node, p_token, false);
    SELECT g.admitted, g.wake_at INTO v_admitted, v_wake
      FROM ledgerflow.wf_limits_admit(array_fill(1, ARRAY[cardinality(p_keys)]), p_keys) g;
    IF v_admitted THEN
        INSERT INTO ledgerflow.workflow_limit_holds (name, run_id, node, token)
        SELECT k, p_run_id, p_node, p_token FROM unnest(p_keys) AS k
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN QUERY SELECT v_admitted, v_wake;
END
$$;

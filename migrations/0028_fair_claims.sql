-- Fair claims across tenants, and run priorities.
--
-- The claim took ready nodes in ready order over every tenant: one tenant's backlog of 2,000 runs delayed
-- every other tenant's first node by the whole backlog. It now serves tenants in turn (round-robin): a
-- claim walks the tenants that have ready rows in name order, starting after the tenant the session's
-- previous claim stopped at and wrapping around, and gives each an equal share of its limit (one node each
-- when there are more tenants than the limit) before any tenant gets more. So another tenant's first node
-- is claimed within one claim cycle: by the first claim whose walk reaches it, at most (tenants with ready
-- rows / limit) claims of a session later, and by the first claim whose limit covers every tenant.
--
-- The turn is the session's (the setting ledgerflow.claim_turn, the tenant its last claim stopped at): no
-- row is written for it and no claimer waits for another. Each worker connection goes round the tenants;
-- several connections go round at once, each of them fairly.
--
-- Priorities: a run's `priority` (RunStarted's, 0 when absent) is copied to each of its queue rows;
-- within a tenant, higher priority is claimed first, then ready order. Priorities do not cross tenants:
-- a tenant's high priority never takes another tenant's turn.
--
-- Index-driven: the next tenant with ready rows, and a tenant's next priority, are each one probe of the
-- index (workflow, version, tenant, priority, ready_at) (a skip scan); a tenant's share is one range scan
-- of it that stops at the first row not yet due, so rows waiting for a timer or a signal are never walked.
-- A claim visits about as many tenants as it claims nodes (more only when tenants have no due rows), not
-- every tenant, and reads no row of a tenant's backlog beyond its share.

ALTER TABLE ledgerflow.workflow_queue ADD COLUMN priority integer;

-- A run's priority is in its RunStarted event (absent: 0). In PL/pgSQL, as ledgerflow.wf_run_version
-- (migration 0021): its plan of the partitioned log is kept for the session, not made again per call.
CREATE FUNCTION ledgerflow.wf_run_priority(p_tenant text, p_run_id uuid) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce(
        (SELECT (e.data ->> 'priority')::integer FROM ledgerflow.events e
          WHERE e.tenant = p_tenant AND e.stream_id = 'wf-' || p_run_id::text AND e.stream_version = 1
            AND e.event_type = 'wf.RunStarted'),
        0);
END
$$;

UPDATE ledgerflow.workflow_queue SET priority = ledgerflow.wf_run_priority(tenant, run_id);
ALTER TABLE ledgerflow.workflow_queue ALTER COLUMN priority SET NOT NULL;

-- As the version (migration 0016): a row queued without a priority (a node's end queueing successors, a
-- retry) takes its run's, so the row always agrees with the log and the queue can be rebuilt from it.
-- A start gives it (its RunStarted is written after the rows, in the same statement).
CREATE FUNCTION ledgerflow.wf_queue_priority() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.priority := ledgerflow.wf_run_priority(NEW.tenant, NEW.run_id);
    RETURN NEW;
END
$$;

CREATE TRIGGER workflow_queue_priority BEFORE INSERT ON ledgerflow.workflow_queue
   FOR EACH ROW WHEN (NEW.priority IS NULL) EXECUTE FUNCTION ledgerflow.wf_queue_priority();

CREATE INDEX workflow_queue_ready_fair
    ON ledgerflow.workflow_queue (workflow, version, tenant, priority, ready_at) WHERE status = 'ready';
-- It replaces the walk's index of migration 0016 (workflow, version, ready_at): with both, the planner may
-- walk a tenant's share in that one's ready order, stepping over every other tenant's rows. The statements
-- that used it for a workflow's rows whatever the tenant (`next_due`, `versions_without_worker`) read a
-- prefix of this one as they read that one's.
DROP INDEX ledgerflow.workflow_queue_ready_by_version;

-- The start of a run (migration 0025) with the run's priority for its first rows.
DROP FUNCTION ledgerflow.wf_start_run(text, text, uuid[], text[], text[], text[], uuid[], uuid[], uuid, text,
                                      text, text[], int[], float8[], text[]);

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
    p_on_stuck            text[],
    p_priority            int
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
           (run_id, node, tenant, workflow, version, attempt, max_crashes, progress_deadline, on_stuck, ready_at,
            priority)
    SELECT p_run_id, u.node, p_tenant, p_workflow, p_version, 0, u.max_crashes, u.progress_deadline,
           u.on_stuck, clock_timestamp(), p_priority
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

-- The next tenant after p_after (in name order) with ready rows of the worker's (workflow, version)s, or
-- NULL: one index probe per (workflow, version). PL/pgSQL keeps its plan for the session (see 0021).
CREATE FUNCTION ledgerflow.wf_claim_next_tenant(p_workflows text[], p_versions text[], p_after text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT min(x.tenant)
          FROM unnest(p_workflows, p_versions) AS w(name, version)
         CROSS JOIN LATERAL (
              SELECT q.tenant FROM ledgerflow.workflow_queue q
               WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                 AND q.tenant > p_after
               ORDER BY q.tenant
               LIMIT 1
         ) x);
END
$$;

-- Up to p_count due ready nodes of one tenant, locked (FOR UPDATE SKIP LOCKED: exactly one claimer per
-- row), higher priority first, then ready order; none of p_taken (this claim's own locks, which SKIP
-- LOCKED does not pass by). Each priority level is one probe for the level and one range scan.
CREATE FUNCTION ledgerflow.wf_claim_tenant(
    p_workflows  text[],
    p_versions   text[],
    p_tenant     text,
    p_count      int,
    p_run_ids    uuid[],
    p_nodes      text[]
) RETURNS TABLE (run_id uuid, node text, workflow text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_bound     int := 2147483647;  -- the highest priority still to look at
    v_priority  int;
    v_took      int := 0;
    v_got       int;
BEGIN
    WHILE v_took < p_count LOOP
        SELECT max(x.priority) INTO v_priority
          FROM unnest(p_workflows, p_versions) AS w(name, version)
         CROSS JOIN LATERAL (
              SELECT q.priority FROM ledgerflow.workflow_queue q
               WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                 AND q.tenant = p_tenant AND q.priority <= v_bound
               ORDER BY q.priority DESC
               LIMIT 1
         ) x;
        EXIT WHEN v_priority IS NULL;
        RETURN QUERY
            SELECT r.run_id, r.node, r.workflow
              FROM unnest(p_workflows, p_versions) AS w(name, version)
             CROSS JOIN LATERAL (
                  SELECT q.run_id, q.node, q.workflow, q.ready_at FROM ledgerflow.workflow_queue q
                   WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                     AND q.tenant = p_tenant AND q.priority = v_priority
                     AND q.ready_at <= statement_timestamp()
                     AND NOT (q.run_id = ANY (p_run_ids) AND (q.run_id, q.node) IN (
                              SELECT t.r, t.n FROM unnest(p_run_ids, p_nodes) AS t(r, n)))
                   ORDER BY q.ready_at
                   LIMIT p_count - v_took
                     FOR UPDATE SKIP LOCKED
             ) r
             ORDER BY r.ready_at
             LIMIT p_count - v_took;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_took := v_took + v_got;
        EXIT WHEN v_priority = -2147483648;
        v_bound := v_priority - 1;
    END LOOP;
END
$$;

-- Up to p_count tenants with ready rows of the worker's (workflow, version)s after p_after (and, when
-- p_upto is given, not after it), in name order: a skip scan, one probe per tenant and (workflow, version).
CREATE FUNCTION ledgerflow.wf_claim_walk(p_workflows text[], p_versions text[], p_after text, p_upto text,
                                         p_count int)
RETURNS text[] LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        WITH RECURSIVE walk(tenant, k) AS (
            SELECT ledgerflow.wf_claim_next_tenant(p_workflows, p_versions, p_after), 1
            UNION ALL
            SELECT ledgerflow.wf_claim_next_tenant(p_workflows, p_versions, walk.tenant), walk.k + 1
              FROM walk
             WHERE walk.tenant IS NOT NULL AND walk.k < p_count AND (p_upto IS NULL OR walk.tenant < p_upto)
        )
        SELECT coalesce(array_agg(walk.tenant ORDER BY walk.k), '{}')
          FROM walk
         WHERE walk.tenant IS NOT NULL AND (p_upto IS NULL OR walk.tenant <= p_upto));
END
$$;

-- The ready nodes a claim takes, locked, in the order they are to be admitted (n). Tenants in turn from
-- the session's turn on, each an equal share of what is left per round (a tenant that had less than its
-- share is done); within a tenant, higher priority first, then ready order.
CREATE FUNCTION ledgerflow.wf_claim_pick(p_workflows text[], p_versions text[], p_limit int)
RETURNS TABLE (run_id uuid, node text, workflow text, n int)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_after     text := coalesce(current_setting('ledgerflow.claim_turn', true), '');
    v_walk      text[];  -- the tenants in turn order, as far as walked
    v_complete  boolean := false;  -- every tenant with ready rows is in v_walk
    v_wrapped   boolean := false;
    v_tenant    text;
    v_i         int;
    v_share     int;
    v_left      int := p_limit;
    v_took      int;
    v_seen      int;  -- how many of v_walk the first round has visited
    v_counts    int[];
    v_last      text;
    v_active    text[] := '{}';
    v_next      text[];
    v_runs      uuid[] := '{}';
    v_nodes     text[] := '{}';
    v_wfs       text[] := '{}';
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- Walk ahead up to p_limit + 1 tenants after the turn, then from the first tenant up to the turn's
    -- own: with no more than p_limit, each gets p_limit / their number; with more, one node each.
    v_walk := ledgerflow.wf_claim_walk(p_workflows, p_versions, v_after, NULL, p_limit + 1);
    IF cardinality(v_walk) <= p_limit AND v_after <> '' THEN
        v_wrapped := true;
        v_walk := v_walk || ledgerflow.wf_claim_walk(p_workflows, p_versions, '', v_after,
                                                     p_limit + 1 - cardinality(v_walk));
    END IF;
    v_complete := cardinality(v_walk) <= p_limit;
    IF cardinality(v_walk) = 0 THEN
        RETURN;
    END IF;
    v_share := CASE WHEN v_complete THEN greatest(1, p_limit / cardinality(v_walk)) ELSE 1 END;

    -- The first round in one statement: each walked tenant's share from its highest priority, in turn
    -- order, until the limit is reached (the nested loop stops there: later tenants are not read).
    WITH got AS (
        SELECT r.run_id, r.node, r.workflow, t.k
          FROM unnest(v_walk) WITH ORDINALITY AS t(tenant, k)
         CROSS JOIN LATERAL (
              SELECT max(x.priority) AS priority
                FROM unnest(p_workflows, p_versions) AS w(name, version)
               CROSS JOIN LATERAL (
                    SELECT q.priority FROM ledgerflow.workflow_queue q
                     WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                       AND q.tenant = t.tenant
                     ORDER BY q.priority DESC
                     LIMIT 1
               ) x
         ) top
         CROSS JOIN LATERAL (
              SELECT d.run_id, d.node, d.workflow
                FROM unnest(p_workflows, p_versions) AS w(name, version)
               CROSS JOIN LATERAL (
                    SELECT q.run_id, q.node, q.workflow, q.ready_at FROM ledgerflow.workflow_queue q
                     WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                       AND q.tenant = t.tenant AND q.priority = top.priority
                       AND q.ready_at <= statement_timestamp()
                     ORDER BY q.ready_at
                     LIMIT v_share
                       FOR UPDATE SKIP LOCKED
               ) d
               ORDER BY d.ready_at
               LIMIT v_share
         ) r
         LIMIT v_left
    )
    SELECT coalesce(array_agg(got.run_id ORDER BY got.k), '{}'),
           coalesce(array_agg(got.node ORDER BY got.k), '{}'),
           coalesce(array_agg(got.workflow ORDER BY got.k), '{}'), count(*),
           coalesce(max(got.k), 0)::int,
           ARRAY(SELECT count(g.k)::int FROM generate_series(1, cardinality(v_walk)) AS s(k)
                   LEFT JOIN got g ON g.k = s.k GROUP BY s.k ORDER BY s.k)
      INTO v_runs, v_nodes, v_wfs, v_took, v_seen, v_counts
      FROM got;
    v_left := v_left - v_took;
    IF v_left > 0 THEN
        v_seen := cardinality(v_walk);  -- the statement went through every walked tenant
    END IF;
    FOR v_i IN 1 .. v_seen LOOP
        v_last := v_walk[v_i];
        -- Its highest priority had fewer due rows than its share (they wait, or peers hold them): the
        -- rest from its lower priorities.
        IF v_counts[v_i] < v_share AND v_left > 0 THEN
            WITH more AS (
                SELECT * FROM ledgerflow.wf_claim_tenant(p_workflows, p_versions, v_walk[v_i],
                                                         least(v_share - v_counts[v_i], v_left),
                                                         v_runs, v_nodes)
            )
            SELECT v_runs || array_agg(more.run_id), v_nodes || array_agg(more.node),
                   v_wfs || array_agg(more.workflow), count(*)
              INTO v_runs, v_nodes, v_wfs, v_took
              FROM more;
            v_left := v_left - v_took;
            v_counts[v_i] := v_counts[v_i] + v_took;
        END IF;
        IF v_counts[v_i] >= v_share THEN
            v_active := v_active || v_walk[v_i];  -- it may have more
        END IF;
    END LOOP;

    -- Still nodes to claim and more tenants than walked: walk on, one tenant at a time.
    v_tenant := v_walk[cardinality(v_walk)];
    WHILE v_left > 0 AND NOT v_complete LOOP
        v_tenant := ledgerflow.wf_claim_next_tenant(p_workflows, p_versions, v_tenant);
        IF v_tenant IS NULL AND NOT v_wrapped AND v_after <> '' THEN
            v_wrapped := true;
            v_tenant := ledgerflow.wf_claim_next_tenant(p_workflows, p_versions, '');
        END IF;
        IF v_tenant IS NULL OR (v_wrapped AND v_tenant > v_after) OR v_tenant = ANY (v_walk) THEN
            v_complete := true;
            EXIT;
        END IF;
        v_walk := v_walk || v_tenant;
        v_last := v_tenant;
        WITH more AS (
            SELECT * FROM ledgerflow.wf_claim_tenant(p_workflows, p_versions, v_tenant,
                                                     least(v_share, v_left), v_runs, v_nodes)
        )
        SELECT v_runs || array_agg(more.run_id), v_nodes || array_agg(more.node),
               v_wfs || array_agg(more.workflow), count(*)
          INTO v_runs, v_nodes, v_wfs, v_took
          FROM more;
        v_left := v_left - v_took;
        IF v_took >= v_share THEN
            v_active := v_active || v_tenant;
        END IF;
    END LOOP;
    -- The session's next claim starts after the last tenant this one visited.
    IF v_last IS NOT NULL THEN
        PERFORM set_config('ledgerflow.claim_turn', v_last, false);
    END IF;

    -- Further rounds, among the tenants that took their whole share, once every tenant was visited.
    WHILE v_left > 0 AND cardinality(v_active) > 0 LOOP
        -- Rounded down (at least 1): a claim's tenants get counts that differ by one at most.
        v_share := greatest(1, v_left / cardinality(v_active));
        v_next := '{}';
        FOREACH v_tenant IN ARRAY v_active LOOP
            EXIT WHEN v_left = 0;
            WITH more AS (
                SELECT * FROM ledgerflow.wf_claim_tenant(p_workflows, p_versions, v_tenant,
                                                         least(v_share, v_left), v_runs, v_nodes)
            )
            SELECT v_runs || array_agg(more.run_id), v_nodes || array_agg(more.node),
                   v_wfs || array_agg(more.workflow), count(*)
              INTO v_runs, v_nodes, v_wfs, v_took
              FROM more;
            v_left := v_left - v_took;
            IF v_took >= v_share THEN
                v_next := v_next || v_tenant;
            END IF;
        END LOOP;
        v_active := v_next;
    END LOOP;
    RETURN QUERY
        SELECT x.r, x.n, x.w, x.k::int FROM unnest(v_runs, v_nodes, v_wfs) WITH ORDINALITY AS x(r, n, w, k);
END
$$;

-- The claim (migration 0027) with its nodes picked fairly.
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
    -- As in migration 0027 (exactly one winner per node, a fresh fencing token, admission of nodes with
    -- limits, each claim's NodeClaimed appended), but the nodes are picked by ledgerflow.wf_claim_pick:
    -- tenants in turn, priorities within a tenant, bounded whatever the backlog.
    RETURN QUERY
    WITH picked AS (
        SELECT p.run_id, p.node, p.workflow, p.n
          FROM ledgerflow.wf_claim_pick(p_workflows, p_versions, p_limit) p
    ), needs AS (
        -- The limits each picked node needs: one index probe per node, nothing found when nothing has
        -- limits.
        SELECT p.n, unnest(nl.limits) AS key
          FROM picked p JOIN ledgerflow.workflow_node_limits nl ON nl.workflow = p.workflow AND nl.node = p.node
    ), refused AS (
        -- Admission, only when a picked node needs a slot: exact under concurrent claimers (an advisory
        -- lock per limit key until commit; see ledgerflow.wf_limits_admit).
        SELECT g.candidate, g.wake_at
          FROM (SELECT WHERE EXISTS (SELECT FROM needs)) AS some_needs
         CROSS JOIN LATERAL ledgerflow.wf_limits_admit(ARRAY(SELECT n FROM needs ORDER BY n, key),
                                                       ARRAY(SELECT key FROM needs ORDER BY n, key)) g
         WHERE NOT g.admitted
    ), deferred AS (
        -- A node refused a slot stays ready, due again when a slot may be free: until then the walk passes
        -- it by, so the nodes queued behind it are not starved.
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
        -- In the order the run streams are locked in (see ledgerflow.wf_record_claims).
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


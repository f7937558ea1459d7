-- Fair claims across tenants, and run priorities.
--
-- The claim took ready nodes in ready order over every tenant: one tenant's backlog of 2,000 runs delayed
-- every other tenant's first node by the whole backlog. It now serves tenants in turn: each claim walks
-- the tenants that have ready rows, starting at a tenant that turns with every claim (a sequence, so no
-- row is written and no claimer waits for another), and gives each an equal share of the claim's limit
-- before any tenant gets more. Another tenant's first node is claimed within one claim cycle: the first
-- claim whose turn reaches it, and in the first claim whose limit covers every tenant with work.
--
-- Priorities: a run's `priority` (RunStarted's, 0 when absent) is copied to each of its queue rows;
-- within a tenant, higher priority is claimed first, then ready order. Priorities do not cross tenants:
-- a tenant's high priority never takes another tenant's turn.
--
-- Index-driven: the tenants (and their priorities) with ready rows are found by a skip scan of the index
-- (workflow, version, tenant, priority, ready_at), one probe per distinct (tenant, priority); each
-- tenant's share is one range scan of the same index that stops at the first row not yet due, so rows
-- waiting for a timer or a signal are never walked. A claim costs O(tenants with ready rows x log n),
-- not O(backlog).

ALTER TABLE ledgerflow.workflow_queue ADD COLUMN priority integer;

-- A run's priority is in its RunStarted event (absent: 0).
CREATE FUNCTION ledgerflow.wf_run_priority(p_tenant text, p_run_id uuid) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT (e.data ->> 'priority')::integer FROM ledgerflow.events e
          WHERE e.tenant = p_tenant AND e.stream_id = 'wf-' || p_run_id::text AND e.stream_version = 1
            AND e.event_type = 'wf.RunStarted'),
        0)
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

CREATE INDEX workflow_queue_ready_fair ON ledgerflow.workflow_queue (workflow, version, tenant, priority, ready_at)
 WHERE status = 'ready';
-- It replaces the walk's index of migration 0016 (workflow, version, ready_at): with both, the planner may
-- walk a tenant's share in that one's ready order, stepping over every other tenant's rows. The statements
-- that used it for a workflow's rows whatever the tenant (`next_due`, `versions_without_worker`) read a
-- prefix of this one as they read that one's.
DROP INDEX ledgerflow.workflow_queue_ready_by_version;

-- The claims' turns: each claim starts its walk of the tenants at its turn (modulo their number) and moves
-- the sequence on by the number of tenants it served, so consecutive claims serve consecutive tenants.
CREATE SEQUENCE ledgerflow.workflow_claim_turns CYCLE;

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

-- The ready nodes a claim takes, locked (FOR UPDATE SKIP LOCKED: exactly one claimer per row), in the
-- order they are to be admitted (n). Tenants in turn, each an equal share of what is left per round (a
-- tenant that had less than its share is done); within a tenant, higher priority first, then ready order.
CREATE FUNCTION ledgerflow.wf_claim_pick(p_workflows text[], p_versions text[], p_limit int)
RETURNS TABLE (run_id uuid, node text, workflow text, n int)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_tenants    text[];   -- tenants with ready rows, in their turn's order
    v_t          int;
    v_start      int;
    v_share      int;
    v_left       int := p_limit;
    v_took       int;
    v_served     int := 0;
    v_active     text[];
    v_next       text[];
    v_tenant     text;
    v_priority   int;
    v_runs       uuid[] := '{}';
    v_nodes      text[] := '{}';
    v_wfs        text[] := '{}';
    v_g_tenants     text[];  -- the groups: (tenant, priority, workflow, version) with ready rows
    v_g_priorities  int[];
    v_g_workflows   text[];
    v_g_versions    text[];
BEGIN
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- The distinct (tenant, priority) of each (workflow, version)'s ready rows: a skip scan, one index probe
    -- per group (a recursive walk: each step the next group after the last).
    SELECT array_agg(g.tenant), array_agg(g.priority), array_agg(w.name), array_agg(w.version)
      INTO v_g_tenants, v_g_priorities, v_g_workflows, v_g_versions
      FROM unnest(p_workflows, p_versions) AS w(name, version)
     CROSS JOIN LATERAL (
          WITH RECURSIVE walk AS (
              (SELECT q.tenant, q.priority FROM ledgerflow.workflow_queue q
                WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                ORDER BY q.tenant, q.priority LIMIT 1)
              UNION ALL
              SELECT nx.tenant, nx.priority FROM walk
               CROSS JOIN LATERAL (
                    SELECT q.tenant, q.priority FROM ledgerflow.workflow_queue q
                     WHERE q.status = 'ready' AND q.workflow = w.name AND q.version = w.version
                       AND (q.tenant, q.priority) > (walk.tenant, walk.priority)
                     ORDER BY q.tenant, q.priority LIMIT 1
               ) nx
          )
          SELECT walk.tenant, walk.priority FROM walk
     ) g;
    SELECT array_agg(DISTINCT t ORDER BY t) INTO v_tenants FROM unnest(v_g_tenants) AS t;
    v_t := coalesce(cardinality(v_tenants), 0);
    IF v_t = 0 THEN
        RETURN;
    END IF;
    v_start := (nextval('ledgerflow.workflow_claim_turns') % v_t)::int;
    v_active := v_tenants[v_start + 1:] || v_tenants[:v_start];
    -- Rounds: every tenant still with work gets an equal share of what is left, in turn order.
    WHILE v_left > 0 AND cardinality(v_active) > 0 LOOP
        -- Rounded down (at least 1): a claim's tenants get counts that differ by one at most.
        v_share := greatest(1, v_left / cardinality(v_active));
        v_next := '{}';
        FOREACH v_tenant IN ARRAY v_active LOOP
            EXIT WHEN v_left = 0;
            v_took := 0;
            FOR v_priority IN
                SELECT DISTINCT g.priority
                  FROM unnest(v_g_tenants, v_g_priorities) AS g(tenant, priority)
                 WHERE g.tenant = v_tenant ORDER BY 1 DESC
            LOOP
                EXIT WHEN v_took >= least(v_share, v_left);
                WITH got AS (
                    SELECT r.run_id, r.node, r.workflow
                      FROM unnest(v_g_tenants, v_g_priorities, v_g_workflows, v_g_versions)
                           AS g(tenant, priority, workflow, version)
                     CROSS JOIN LATERAL (
                          SELECT q.run_id, q.node, q.workflow, q.ready_at FROM ledgerflow.workflow_queue q
                           WHERE q.status = 'ready' AND q.workflow = g.workflow AND q.version = g.version
                             AND q.tenant = g.tenant AND q.priority = g.priority
                             AND q.ready_at <= statement_timestamp()
                             -- Rows this claim took in an earlier round are its own locks: SKIP LOCKED
                             -- does not pass them by.
                             AND NOT (q.run_id = ANY (v_runs) AND (q.run_id, q.node) IN (
                                      SELECT x.r, x.n FROM unnest(v_runs, v_nodes) AS x(r, n)))
                           ORDER BY q.ready_at
                           LIMIT least(v_share, v_left) - v_took
                             FOR UPDATE SKIP LOCKED
                     ) r
                     WHERE g.tenant = v_tenant AND g.priority = v_priority
                     ORDER BY r.ready_at
                     LIMIT least(v_share, v_left) - v_took
                )
                SELECT v_runs || array_agg(got.run_id), v_nodes || array_agg(got.node),
                       v_wfs || array_agg(got.workflow), v_took + count(*)
                  INTO v_runs, v_nodes, v_wfs, v_took
                  FROM got;
            END LOOP;
            IF v_took > 0 THEN
                v_served := v_served + 1;
                v_left := v_left - v_took;
                IF v_took >= v_share THEN
                    v_next := v_next || v_tenant;  -- it may have more
                END IF;
            END IF;
        END LOOP;
        v_active := v_next;
    END LOOP;
    -- The next claim starts at the tenant after the last one this claim served.
    IF v_served > 1 THEN
        PERFORM nextval('ledgerflow.workflow_claim_turns') FROM generate_series(2, v_served);
    END IF;
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
        SELECT p.run_id, p.node, p.workflow, p.n FROM ledgerflow.wf_claim_pick(p_workflows, p_versions, p_limit) p
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


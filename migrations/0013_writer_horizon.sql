-- The log's safe horizon waits only for transactions that write to the log.
--
-- Readers of the global log order and resume by (transaction_id, position) and read only below a horizon
-- that no later commit can land under (see 0001). That horizon used to be the snapshot's xmin: the oldest
-- transaction running anywhere on the server, so a report query holding an xid, or a CREATE DATABASE, in
-- any database stalled every reader. Now it is the oldest transaction that holds this database's log
-- writer lock, or may have held it.
--
-- Writers. Every transaction that inserts events first calls ledgerflow.log_writer(), which takes the log
-- writer lock (a transaction-level advisory lock, keyed by the backend so that writers never contend for
-- one lock) and returns the transaction's stamp, the value its events carry in transaction_id:
--   * a transaction with no xid yet takes the lock and then its xid: the stamp is its own xid;
--   * a transaction that already has an xid (it wrote something else first, e.g. a workflow claim that
--     updates the queue and then appends) may have been passed over by a reader while it held no lock, so
--     its events must not carry that older xid. Its stamp is the xid of a subtransaction begun after the
--     lock: an xid handed out after the lock was taken, and finished (rolled back) at once.
-- Either way the stamp is an xid handed out after the lock was taken and finished by the time the writer
-- commits; so is every later append of the transaction, which reuses the stamp.
--
-- Readers. ledgerflow.log_holders() returns the transactions of the statement's snapshot that may still
-- add events below the horizon: every running transaction of the snapshot except those that, after the
-- snapshot was taken, are seen running without the writer lock (one read of the lock table) and are
-- still running after that read. Those are no writers: a writer holds the lock from before its stamp until
-- it ends, and one that joins later gets a stamp beyond any horizon a reader computed before.
-- Conservative where it cannot tell (prepared transactions, a transaction ending while it is looked at):
-- those hold the horizon.

-- Rows never survive here: ledgerflow.log_writer_late inserts one in a subtransaction to be handed a fresh
-- xid (the row's xmin), then rolls it back.
CREATE UNLOGGED TABLE ledgerflow.log_writer_stamps ();

-- The stamp of a transaction that already has an xid (see above). 1279675479 is "LFLW", the first key of
-- the log writer lock, here and in log_writer and log_holders.
CREATE FUNCTION ledgerflow.log_writer_late() RETURNS xid8
LANGUAGE plpgsql AS $$
DECLARE
    v_top    bigint := pg_current_xact_id()::text::bigint;
    v_sub    xid;
    v_stamp  xid8;
BEGIN
    PERFORM pg_advisory_xact_lock(1279675479, pg_backend_pid());
    -- Gap-freedom: the subtransaction's xid is handed out after the lock was taken. Rolling it back ends
    -- it at once, so the horizon can pass it as soon as the writer commits.
    BEGIN
        INSERT INTO ledgerflow.log_writer_stamps DEFAULT VALUES RETURNING xmin INTO v_sub;
        RAISE EXCEPTION USING ERRCODE = 'LFW01';
    EXCEPTION WHEN SQLSTATE 'LFW01' THEN
        NULL;
    END;
    -- The row's xmin is a 32-bit xid handed out after the top transaction's: widen it from there.
    v_stamp := (v_top + ((v_sub::text::bigint - v_top % 4294967296 + 4294967296) % 4294967296))::text::xid8;
    PERFORM set_config('ledgerflow.log_writer_stamp', v_stamp::text, true);
    RETURN v_stamp;
END
$$;

-- The calling transaction's stamp, taking the log writer lock first if it does not hold it yet. An SQL
-- function that PostgreSQL inlines into the calling statement: an autocommit append pays a few function
-- calls, not a call into PL/pgSQL. CASE evaluates its branches in order, so the lock is taken before
-- pg_current_xact_id() hands the transaction its xid. The setting (transaction-local) remembers the stamp
-- for the transaction's later appends; only this function and log_writer_late set it.
CREATE FUNCTION ledgerflow.log_writer() RETURNS xid8
LANGUAGE sql AS $$
SELECT CASE
    WHEN current_setting('ledgerflow.log_writer_stamp', true) <> ''
        THEN current_setting('ledgerflow.log_writer_stamp', true)::xid8
    WHEN pg_current_xact_id_if_assigned() IS NULL
        THEN set_config('ledgerflow.log_writer_stamp',
                        CASE WHEN pg_advisory_xact_lock(1279675479, pg_backend_pid()) IS NULL THEN NULL
                             ELSE pg_current_xact_id()::text END,
                        true)::xid8
    ELSE ledgerflow.log_writer_late()
END
$$;

-- The transactions that hold the log's horizon back (see above), for the calling statement's snapshot.
-- STABLE: it sees the caller's snapshot, the one its scan of the log uses.
CREATE FUNCTION ledgerflow.log_holders() RETURNS SETOF xid8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_snapshot  pg_snapshot := pg_current_snapshot();
    v_database  oid;
    v_others    xid[];
BEGIN
    IF pg_snapshot_xmin(v_snapshot) = pg_snapshot_xmax(v_snapshot) THEN
        RETURN;  -- nothing ran when the snapshot was taken
    END IF;
    SELECT oid INTO v_database FROM pg_database WHERE datname = current_database();
    -- One read of the lock table (pg_locks copies it at one instant, taken after the snapshot): the
    -- transactions running without this database's writer lock. Each holds the lock on its own xid.
    WITH l AS MATERIALIZED (
        SELECT locktype, pid, transactionid, database, classid, objsubid, mode, granted
          FROM pg_locks
         WHERE locktype IN ('transactionid', 'advisory') AND pid IS NOT NULL
    )
    SELECT array_agg(x.transactionid) INTO v_others
      FROM l x
     WHERE x.locktype = 'transactionid' AND x.mode = 'ExclusiveLock' AND x.granted
       AND NOT EXISTS (SELECT 1 FROM l w
                        WHERE w.locktype = 'advisory' AND w.pid = x.pid AND w.database = v_database
                          AND w.classid = 1279675479 AND w.objsubid = 2);
    -- Gap-freedom: a writer that ended between the snapshot and the read of the lock table no longer holds
    -- the lock, yet its events are invisible to the snapshot. So a transaction is passed over only if it is
    -- still running now, after the read: then it ran without the lock when it was read.
    RETURN QUERY
        SELECT x FROM pg_snapshot_xip(v_snapshot) AS x
         WHERE v_others IS NULL OR NOT x::xid = ANY (v_others)
            OR pg_xact_status(x) IS DISTINCT FROM 'in progress';
END
$$;

-- The safe horizon of the calling statement's snapshot: readers see every event whose transaction_id is
-- below it. The oldest holder, else the snapshot's xmax (every transaction below it has ended).
CREATE FUNCTION ledgerflow.log_horizon() RETURNS xid8
LANGUAGE sql STABLE AS $$
SELECT coalesce((SELECT h FROM ledgerflow.log_holders() AS h ORDER BY h LIMIT 1),
                pg_snapshot_xmax(pg_current_snapshot()))
$$;

-- Appends with several streams or an idempotency key (see 0001), now stamped by ledgerflow.log_writer
-- before their first write. Unchanged otherwise.
CREATE OR REPLACE FUNCTION ledgerflow.append_events(
    p_tenant           text,
    p_idempotency_key  text,
    p_request_hash     text,
    p_stream_ids       text[],
    p_expected         bigint[],
    p_counts           int[],
    p_event_ids        uuid[],
    p_types            text[],
    p_data             jsonb[],
    p_metadata         jsonb[],
    p_correlation_ids  uuid[],
    p_causation_ids    uuid[]
) RETURNS TABLE (stream_id text, stream_version bigint, "position" bigint, transaction_id text, duplicate boolean)
LANGUAGE plpgsql AS $$
-- The output columns share names with table columns; in SQL statements below, names mean columns.
#variable_conflict use_column
DECLARE
    v_stored   ledgerflow.idempotency_keys;
    v_base     bigint;
    v_actual   bigint;
    v_offset   int := 0;
    v_count    int;
    v_result   jsonb := '[]';
    v_rows     jsonb;
    v_stamp    xid8;
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        -- A concurrent append with the same key blocks here until the first one commits or rolls
        -- back, so exactly one of them writes and the other gets the first one's result.
        SELECT * INTO v_stored FROM ledgerflow.idempotency_keys k
         WHERE k.tenant = p_tenant AND k.key = p_idempotency_key;
        IF NOT FOUND THEN
            -- Gap-freedom: the writer lock before the first write (see ledgerflow.log_writer).
            v_stamp := ledgerflow.log_writer();
            INSERT INTO ledgerflow.idempotency_keys (tenant, key, request_hash, result)
            VALUES (p_tenant, p_idempotency_key, p_request_hash, '[]')
            ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                SELECT * INTO v_stored FROM ledgerflow.idempotency_keys k
                 WHERE k.tenant = p_tenant AND k.key = p_idempotency_key;
            END IF;
        END IF;
        IF v_stored.key IS NOT NULL THEN
            IF v_stored.request_hash <> p_request_hash THEN
                RAISE EXCEPTION 'idempotency key reused with different content'
                    USING ERRCODE = 'LF002',
                          DETAIL = json_build_object('tenant', p_tenant, 'key', p_idempotency_key)::text;
            END IF;
            RETURN QUERY
                SELECT r->>0, (r->>1)::bigint, (r->>2)::bigint, r->>3, true
                  FROM jsonb_array_elements(v_stored.result) AS r;
            RETURN;
        END IF;
    END IF;
    -- Gap-freedom: the writer lock before the first write (see ledgerflow.log_writer).
    v_stamp := ledgerflow.log_writer();

    FOR i IN 1 .. cardinality(p_stream_ids) LOOP
        v_count := p_counts[i];
        v_base := NULL;
        -- The stream row is the per-stream lock: concurrent appends to one stream queue on it,
        -- appends to different streams never wait for each other.
        IF p_expected[i] = -1 THEN
            INSERT INTO ledgerflow.streams AS s (tenant, stream_id, version)
            VALUES (p_tenant, p_stream_ids[i], v_count)
            ON CONFLICT (tenant, stream_id) DO UPDATE SET version = s.version + v_count
            RETURNING s.version - v_count INTO v_base;
        ELSIF p_expected[i] = -2 THEN
            INSERT INTO ledgerflow.streams (tenant, stream_id, version)
            VALUES (p_tenant, p_stream_ids[i], v_count)
            ON CONFLICT DO NOTHING
            RETURNING 0 INTO v_base;
        ELSE
            UPDATE ledgerflow.streams s SET version = s.version + v_count
             WHERE s.tenant = p_tenant AND s.stream_id = p_stream_ids[i]
               AND (p_expected[i] = -3 OR s.version = p_expected[i])
            RETURNING s.version - v_count INTO v_base;
        END IF;
        IF v_base IS NULL THEN
            SELECT s.version INTO v_actual FROM ledgerflow.streams s
             WHERE s.tenant = p_tenant AND s.stream_id = p_stream_ids[i];
            RAISE EXCEPTION 'wrong expected version'
                USING ERRCODE = 'LF001',
                      DETAIL = json_build_object('tenant', p_tenant, 'stream_id', p_stream_ids[i],
                                                 'expected', p_expected[i], 'actual', v_actual)::text;
        END IF;

        WITH inserted AS (
            INSERT INTO ledgerflow.events AS e (transaction_id, tenant, stream_id, stream_version, event_id,
                                                event_type, data, metadata, correlation_id, causation_id)
            SELECT v_stamp, p_tenant, p_stream_ids[i], v_base + u.n, u.event_id, u.event_type,
                   u.data, u.metadata, u.correlation_id, u.causation_id
              FROM unnest(p_event_ids[v_offset + 1 : v_offset + v_count],
                          p_types[v_offset + 1 : v_offset + v_count],
                          p_data[v_offset + 1 : v_offset + v_count],
                          p_metadata[v_offset + 1 : v_offset + v_count],
                          p_correlation_ids[v_offset + 1 : v_offset + v_count],
                          p_causation_ids[v_offset + 1 : v_offset + v_count])
                   WITH ORDINALITY AS u(event_id, event_type, data, metadata, correlation_id, causation_id, n)
             ORDER BY u.n
            RETURNING e.stream_id, e.stream_version, e.position, e.transaction_id::text AS transaction_id
        )
        SELECT coalesce(jsonb_agg(jsonb_build_array(x.stream_id, x.stream_version, x.position, x.transaction_id)
                                  ORDER BY x.position), '[]')
          INTO v_rows FROM inserted x;
        v_result := v_result || v_rows;
        v_offset := v_offset + v_count;
    END LOOP;

    IF p_idempotency_key IS NOT NULL THEN
        UPDATE ledgerflow.idempotency_keys k SET result = v_result
         WHERE k.tenant = p_tenant AND k.key = p_idempotency_key;
    END IF;

    RETURN QUERY
        SELECT r->>0, (r->>1)::bigint, (r->>2)::bigint, r->>3, false
          FROM jsonb_array_elements(v_result) AS r;
END
$$;

COMMENT ON COLUMN ledgerflow.events.transaction_id IS
    'The writing transaction''s stamp (ledgerflow.log_writer): its xid, or for a transaction that wrote '
    'something else first, an xid handed out after it took the log writer lock. Readers of the global log '
    'order and resume by (transaction_id, position), below ledgerflow.log_horizon().';

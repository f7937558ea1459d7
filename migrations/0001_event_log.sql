-- The event log: the only source of truth. Everything else in ledgerflow is derived from it.

CREATE TABLE ledgerflow.streams (
    tenant      text   NOT NULL,
    stream_id   text   NOT NULL,
    -- The version of the stream's last event; stream versions start at 1.
    version     bigint NOT NULL CHECK (version >= 1),
    PRIMARY KEY (tenant, stream_id)
);

CREATE TABLE ledgerflow.events (
    position        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writing transaction's id. Readers of the global log order and resume by
    -- (transaction_id, position) and only read below the oldest running transaction, which is what
    -- makes reading gap-free: positions alone are handed out before commit, and transactions commit
    -- out of order, so a reader going by position would skip an event that commits late.
    transaction_id  xid8   NOT NULL DEFAULT pg_current_xact_id(),
    tenant          text   NOT NULL CHECK (tenant ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    stream_id       text   NOT NULL CHECK (stream_id <> '' AND length(stream_id) <= 400),
    category        text   GENERATED ALWAYS AS (split_part(stream_id, '-', 1)) STORED,
    stream_version  bigint NOT NULL CHECK (stream_version >= 1),
    event_id        uuid   NOT NULL,
    event_type      text   NOT NULL CHECK (event_type <> ''),
    data            jsonb  NOT NULL CHECK (jsonb_typeof(data) = 'object'),
    metadata        jsonb  NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    correlation_id  uuid,
    causation_id    uuid,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_event_id_unique UNIQUE (event_id),
    -- Optimistic concurrency per stream: two appends can never both write the same version.
    CONSTRAINT events_stream_version_unique UNIQUE (tenant, stream_id, stream_version)
);

-- The resume order of every global reader.
CREATE INDEX events_resume_order ON ledgerflow.events (transaction_id, position);

-- Append-only: the database itself refuses to change or remove an event, whoever asks.
CREATE FUNCTION ledgerflow.refuse_event_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledgerflow.events is append-only: % is refused', TG_OP
        USING ERRCODE = 'LF003',
              HINT = 'Correct a mistake by appending a compensating event.';
END
$$;

CREATE TRIGGER events_refuse_update_delete
    BEFORE UPDATE OR DELETE ON ledgerflow.events
    FOR EACH ROW EXECUTE FUNCTION ledgerflow.refuse_event_change();
CREATE TRIGGER events_refuse_truncate
    BEFORE TRUNCATE ON ledgerflow.events
    FOR EACH STATEMENT EXECUTE FUNCTION ledgerflow.refuse_event_change();
-- ENABLE ALWAYS: the triggers fire even with session_replication_role = replica, which would
-- otherwise silence them.
ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_refuse_update_delete;
ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_refuse_truncate;
REVOKE UPDATE, DELETE, TRUNCATE ON ledgerflow.events FROM PUBLIC;

-- Idempotency keys, scoped per tenant and separate from event ids. The stored result lets a retry
-- after a lost commit acknowledgement get the original answer.
CREATE TABLE ledgerflow.idempotency_keys (
    tenant        text        NOT NULL,
    key           text        NOT NULL,
    request_hash  text        NOT NULL,
    result        jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key)
);

-- One append: any number of streams, each with its expected version, atomically, in one statement
-- (one round trip). Events arrive as flat arrays, p_counts[i] of them for p_stream_ids[i].
-- p_expected: n >= 1 exact version, -1 any, -2 no stream, -3 stream exists.
-- Raises LF001 (wrong expected version) or LF002 (idempotency key reused with other content).
CREATE FUNCTION ledgerflow.append_events(
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
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        -- A concurrent append with the same key blocks here until the first one commits or rolls
        -- back, so exactly one of them writes and the other gets the first one's result.
        SELECT * INTO v_stored FROM ledgerflow.idempotency_keys k
         WHERE k.tenant = p_tenant AND k.key = p_idempotency_key;
        IF NOT FOUND THEN
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
            INSERT INTO ledgerflow.events AS e (tenant, stream_id, stream_version, event_id, event_type,
                                                data, metadata, correlation_id, causation_id)
            SELECT p_tenant, p_stream_ids[i], v_base + u.n, u.event_id, u.event_type,
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

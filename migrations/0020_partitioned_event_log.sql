-- A log that grows for years: ledgerflow.events becomes a table partitioned by position range, so that old
-- partitions can be detached, archived to files and re-attached for a rebuild, while appends and reads
-- touch only the indexes of the partitions they need.
--
-- What the unpartitioned table's unique indexes guaranteed, and how it still holds across partitions
-- (PostgreSQL only enforces a unique index on a partitioned table when it includes the partition key):
--   * position: the primary key (position is the partition key), unique across the whole log.
--   * (tenant, event_id): moved to ledgerflow.event_ids, an unpartitioned table filled by a BEFORE INSERT
--     trigger on every partition, whatever writes (the append function, the one-stream statements, COPY
--     imports, plain INSERTs). Its primary key keeps the constraint's name, events_tenant_event_id_unique,
--     so a reused id is refused with the same error as before. Rows stay when a partition is archived:
--     an archived event's id is still taken.
--   * (tenant, stream_id, stream_version): every writer reserves the versions it writes by moving the
--     stream's row in ledgerflow.streams under that row's lock (append_events, the one-stream statements,
--     the import's bump), so two writers never hold the same version, in one partition or in two. Each
--     partition also keeps a unique index on (tenant, stream_id, stream_version), which serves stream
--     reads and refuses a duplicate within the partition.

-- Partitions are created ahead of need by ledgerflow.events_ensure_partitions, each this many positions
-- wide (a change applies to partitions created afterwards).
CREATE TABLE ledgerflow.event_partitioning (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    partition_size  bigint  NOT NULL CHECK (partition_size >= 2)
);
INSERT INTO ledgerflow.event_partitioning (partition_size) VALUES (1000000);

-- Every partition the log ever had: attached (in ledgerflow.events) or archived (in a file; see
-- `ledgerflow log archive`). Positions from_position <= p < to_position.
CREATE TABLE ledgerflow.event_partitions (
    name           text        PRIMARY KEY,
    from_position  bigint      NOT NULL,
    to_position    bigint      NOT NULL CHECK (to_position > from_position),
    state          text        NOT NULL DEFAULT 'attached' CHECK (state IN ('attached', 'archived')),
    events         bigint,
    sha256         text,
    archived_to    text,
    archived_at    timestamptz,
    CONSTRAINT event_partitions_from_unique UNIQUE (from_position)
);

-- The unpartitioned table steps aside (its data is copied below) and frees its names.
ALTER TABLE ledgerflow.events RENAME TO events_unpartitioned;
ALTER TABLE ledgerflow.events_unpartitioned RENAME CONSTRAINT events_pkey TO events_unpartitioned_pkey;
ALTER TABLE ledgerflow.events_unpartitioned
    RENAME CONSTRAINT events_tenant_event_id_unique TO events_unpartitioned_event_id_unique;
ALTER TABLE ledgerflow.events_unpartitioned
    RENAME CONSTRAINT events_stream_version_unique TO events_unpartitioned_stream_version_unique;
ALTER INDEX ledgerflow.events_resume_order RENAME TO events_unpartitioned_resume_order;
ALTER SEQUENCE ledgerflow.events_position_seq RENAME TO events_unpartitioned_position_seq;
DO $$
DECLARE
    v_name text;
BEGIN
    FOR v_name IN SELECT conname FROM pg_constraint
                   WHERE conrelid = 'ledgerflow.events_unpartitioned'::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE ledgerflow.events_unpartitioned RENAME CONSTRAINT %I TO %I',
                       v_name, 'unpartitioned_' || v_name);
    END LOOP;
END
$$;

CREATE TABLE ledgerflow.event_ids (
    tenant    text NOT NULL,
    event_id  uuid NOT NULL,
    CONSTRAINT events_tenant_event_id_unique PRIMARY KEY (tenant, event_id)
);

CREATE TABLE ledgerflow.events (
    position        bigint GENERATED ALWAYS AS IDENTITY,
    -- See 0001 and 0013: readers order and resume by (transaction_id, position), below the log's horizon.
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
    CONSTRAINT events_pkey PRIMARY KEY (position)
) PARTITION BY RANGE (position);

-- The resume order of every global reader, in every partition.
CREATE INDEX events_resume_order ON ledgerflow.events (transaction_id, position);

-- A standalone table shaped as a partition of the log for positions [p_from, p_to): the columns and
-- checks of ledgerflow.events, the range as a check (so attaching it needs no scan), the per-partition
-- unique stream index, and a TRUNCATE trigger (the parent's does not fire for a partition truncated
-- directly). Used for new partitions and for restoring archived ones.
CREATE FUNCTION ledgerflow.events_partition_table(p_name text, p_from bigint, p_to bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TABLE ledgerflow.%I (LIKE ledgerflow.events INCLUDING DEFAULTS INCLUDING GENERATED'
                   ' INCLUDING CONSTRAINTS INCLUDING STORAGE)', p_name);
    EXECUTE format('ALTER TABLE ledgerflow.%I ADD CONSTRAINT %I CHECK (position >= %s AND position < %s)',
                   p_name, p_name || '_range', p_from, p_to);
    EXECUTE format('CREATE UNIQUE INDEX %I ON ledgerflow.%I (tenant, stream_id, stream_version)',
                   p_name || '_stream_version_unique', p_name);
    EXECUTE format('CREATE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON ledgerflow.%I'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION ledgerflow.refuse_event_change()', p_name);
    EXECUTE format('ALTER TABLE ledgerflow.%I ENABLE ALWAYS TRIGGER events_refuse_truncate', p_name);
    EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON ledgerflow.%I FROM PUBLIC', p_name);
END
$$;

-- Creates partitions until the last one ends more than p_headroom positions (default: one partition)
-- past the last position handed out; returns where the last partition ends. Called by the store when an
-- append lands in the last partition, before an import, and at migration: never on the append's own
-- round trip. ATTACH PARTITION takes only a SHARE UPDATE EXCLUSIVE lock on the log, which appends and
-- reads do not wait for; the advisory lock makes concurrent callers create each partition once.
CREATE FUNCTION ledgerflow.events_ensure_partitions(p_headroom bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_size  bigint;
    v_last  bigint;
    v_end   bigint;
    v_n     bigint;
    v_name  text;
BEGIN
    SELECT partition_size INTO v_size FROM ledgerflow.event_partitioning;
    v_last := coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledgerflow.events', 'position')::regclass), 0);
    SELECT max(to_position) INTO v_end FROM ledgerflow.event_partitions;
    IF v_end > v_last + coalesce(p_headroom, v_size) THEN
        RETURN v_end;
    END IF;
    -- "ledgerflow partitions" among advisory locks.
    PERFORM pg_advisory_xact_lock(7306916163436339059);
    LOOP
        SELECT coalesce(max(to_position), 1), count(*) INTO v_end, v_n FROM ledgerflow.event_partitions;
        EXIT WHEN v_end > v_last + coalesce(p_headroom, v_size);
        v_name := 'events_p' || lpad((v_n + 1)::text, 6, '0');
        PERFORM ledgerflow.events_partition_table(v_name, v_end, v_end + v_size);
        EXECUTE format('ALTER TABLE ledgerflow.events ATTACH PARTITION ledgerflow.%I FOR VALUES FROM (%s) TO (%s)',
                       v_name, v_end, v_end + v_size);
        INSERT INTO ledgerflow.event_partitions (name, from_position, to_position)
        VALUES (v_name, v_end, v_end + v_size);
    END LOOP;
    RETURN v_end;
END
$$;

-- The existing log moves over: positions, transaction ids and times kept, the identity continuing after
-- the last position.
SELECT setval(pg_get_serial_sequence('ledgerflow.events', 'position'), max(position))
  FROM ledgerflow.events_unpartitioned HAVING max(position) IS NOT NULL;
SELECT ledgerflow.events_ensure_partitions();
INSERT INTO ledgerflow.events (position, transaction_id, tenant, stream_id, stream_version, event_id, event_type,
                               data, metadata, correlation_id, causation_id, recorded_at)
OVERRIDING SYSTEM VALUE
SELECT position, transaction_id, tenant, stream_id, stream_version, event_id, event_type, data, metadata,
       correlation_id, causation_id, recorded_at
  FROM ledgerflow.events_unpartitioned;
INSERT INTO ledgerflow.event_ids (tenant, event_id) SELECT tenant, event_id FROM ledgerflow.events_unpartitioned;
DROP TABLE ledgerflow.events_unpartitioned;

CREATE FUNCTION ledgerflow.claim_event_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A reused id within a tenant fails here, on events_tenant_event_id_unique, and the append with it.
    INSERT INTO ledgerflow.event_ids (tenant, event_id) VALUES (NEW.tenant, NEW.event_id);
    RETURN NEW;
END
$$;
CREATE TRIGGER events_claim_event_id
    BEFORE INSERT ON ledgerflow.events
    FOR EACH ROW EXECUTE FUNCTION ledgerflow.claim_event_id();

COMMENT ON COLUMN ledgerflow.events.transaction_id IS
    'The writing transaction''s stamp (ledgerflow.log_writer): its xid, or for a transaction that wrote '
    'something else first, an xid handed out after it took the log writer lock. Readers of the global log '
    'order and resume by (transaction_id, position), below ledgerflow.log_horizon().';

-- Append-only, as in 0001: on the parent (cloned to every partition) and, for TRUNCATE, on each partition.
CREATE TRIGGER events_refuse_update_delete
    BEFORE UPDATE OR DELETE ON ledgerflow.events
    FOR EACH ROW EXECUTE FUNCTION ledgerflow.refuse_event_change();
CREATE TRIGGER events_refuse_truncate
    BEFORE TRUNCATE ON ledgerflow.events
    FOR EACH STATEMENT EXECUTE FUNCTION ledgerflow.refuse_event_change();
ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_claim_event_id;
ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_refuse_update_delete;
ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_refuse_truncate;
REVOKE UPDATE, DELETE, TRUNCATE ON ledgerflow.events FROM PUBLIC;

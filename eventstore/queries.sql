-- The event store's SQL. Every statement the eventstore package runs is here, named.

-- name: append
-- One round trip, one atomic statement, whatever the number of streams (see ledgerflow.append_events).
-- Arrays travel in binary: in text form every JSON document would be escaped character by character.
SELECT stream_id, stream_version, position, transaction_id::bigint, duplicate
  FROM ledgerflow.append_events(
      p_tenant => %(tenant)s, p_idempotency_key => %(idempotency_key)s, p_request_hash => %(request_hash)s,
      p_stream_ids => %(stream_ids)b::text[], p_expected => %(expected)b::bigint[],
      p_counts => %(counts)b::int[], p_event_ids => %(event_ids)b::uuid[], p_types => %(types)b::text[],
      p_data => %(data)b::text[]::jsonb[], p_metadata => %(metadata)b::text[]::jsonb[],
      p_correlation_ids => %(correlation_ids)b::uuid[], p_causation_ids => %(causation_ids)b::uuid[])

-- name: append_one_stream
-- The common case, one stream and no idempotency key, as one plain statement: the bump (one of the three
-- below, filled in by the store) moves the stream's version under its row lock, and the events take the
-- versions after it. If the expected version does not hold, the bump yields no row and nothing is inserted.
-- Gap-freedom: the bump reads `writer`, so the log writer lock is taken before the statement's first
-- write (see ledgerflow.log_writer), and the events carry the transaction's stamp.
{writer}, bumped AS ({bump})
INSERT INTO ledgerflow.events AS e (transaction_id, tenant, stream_id, stream_version, event_id, event_type, data,
                                    metadata, correlation_id, causation_id)
SELECT w.stamp, %(tenant)s, %(stream_id)s, b.base + u.n, u.event_id, u.event_type, u.data::jsonb,
       u.metadata::jsonb, u.correlation_id, u.causation_id
  FROM writer w, bumped b,
       unnest(%(event_ids)b::uuid[], %(types)b::text[], %(data)b::text[], %(metadata)b::text[],
              %(correlation_ids)b::uuid[], %(causation_ids)b::uuid[])
       WITH ORDINALITY AS u(event_id, event_type, data, metadata, correlation_id, causation_id, n)
 ORDER BY u.n
RETURNING e.stream_id, e.stream_version, e.position, e.transaction_id::text::bigint

-- name: append_one_event
-- The most common case of all, one event: the same statement with plain parameters (no arrays to encode).
{writer}, bumped AS ({bump})
INSERT INTO ledgerflow.events AS e (transaction_id, tenant, stream_id, stream_version, event_id, event_type, data,
                                    metadata, correlation_id, causation_id)
SELECT w.stamp, %(tenant)s, %(stream_id)s, b.base + 1, %(event_id)s, %(type)s, %(one_data)s::jsonb,
       %(one_metadata)s::jsonb, %(correlation_id)s::uuid, %(causation_id)s::uuid
  FROM writer w, bumped b
RETURNING e.stream_id, e.stream_version, e.position, e.transaction_id::text::bigint

-- name: writer
-- The transaction's stamp, ledgerflow.log_writer(), with its commonest case written out: an autocommit
-- append has no xid yet, so it takes the log writer lock (1279675479, "LFLW", keyed by backend), then its
-- xid, which is its stamp, and needs no more. log_writer() would also remember the stamp for the
-- transaction's later appends, a setting that costs the one-event append about 13 µs of server CPU, a
-- fourteenth of it; a transaction that appends again without it gets a stamp of its own from log_writer(),
-- as correct.
-- CASE evaluates in order: the lock is taken before pg_current_xact_id() hands out the xid.
WITH writer AS MATERIALIZED (
    SELECT CASE WHEN pg_current_xact_id_if_assigned() IS NOT NULL THEN ledgerflow.log_writer()
                WHEN pg_advisory_xact_lock(1279675479, pg_backend_pid()) IS NULL THEN NULL
                ELSE pg_current_xact_id() END AS stamp
)

-- name: bump_any
-- Each bump reads `writer`: the row it writes is made only once the log writer lock is held.
INSERT INTO ledgerflow.streams AS s (tenant, stream_id, version)
SELECT %(tenant)s, %(stream_id)s, %(count)s FROM writer
ON CONFLICT (tenant, stream_id) DO UPDATE SET version = s.version + excluded.version
RETURNING s.version - %(count)s AS base

-- name: bump_no_stream
INSERT INTO ledgerflow.streams (tenant, stream_id, version)
SELECT %(tenant)s, %(stream_id)s, %(count)s FROM writer
ON CONFLICT DO NOTHING
RETURNING 0::bigint AS base

-- name: bump_existing
UPDATE ledgerflow.streams s SET version = s.version + %(count)s
  FROM writer w
 WHERE s.tenant = %(tenant)s AND s.stream_id = %(stream_id)s
   AND (%(expected)s::bigint IS NULL OR s.version = %(expected)s::bigint)
RETURNING s.version - %(count)s AS base

-- name: read_all
-- Gap-free reading of the global log. Only events below the log's horizon are read: every writer that
-- could still add an event below it has finished (see ledgerflow.log_holders), so no event can later
-- appear before the returned cursor. Order and resume by (transaction_id, position), never by position
-- alone. The horizon comes from the same statement snapshot as the scan (log_horizon is STABLE).
-- A page holds at most %(limit)s events and stops once their size passes %(max_bytes)s (always with at
-- least one event): the walk takes one event at a time in resume order, each one index step after the
-- last, and stops at the budget, so an event beyond it is never read, let alone sent. `bytes` is the
-- page's running size: data and metadata as JSON text, plus the envelope. `ended`: the transaction the
-- horizon stopped at had ended by the time it was looked at (it ended during the read, which log_holders
-- cannot tell from a writer's ending): the reader is told to read again at once rather than wait.
-- The log is partitioned by position (migration 0020). Once per page, `firsts` finds each attached
-- partition's first event after the cursor (one index probe per partition). `floor` is the first position
-- of the oldest partition holding one. The run: `run_from`..`run_to` is the partition holding the earliest
-- of these events; `run_below` is the earliest first event of any other partition, or (horizon, 0) if
-- none comes before that. Every readable event before `run_below` in resume order lies in the run's
-- partition, so the walk's steps probe that one partition alone, below `run_below` (so below the horizon).
-- When such a step finds nothing (the run's partition holds nothing more before `run_below`), the walk
-- turns `wide` with a row without event (left out of the page): its later steps probe every partition
-- from the floor on, below the horizon, from `run_below` on while the cursor is before it (nothing before
-- it is left to read); a wide step that finds nothing ends the page. Either way a step is one index scan
-- of the log, its partitions pruned at run time to the mode's bounds. Near the head a page thus reads one
-- partition's index per event, not also that of the full partition before the head's or of the empty one
-- kept ahead (bench/log_size.py: 4 buffers an event at 100,000 events and at 10 million, where it was 6
-- and 9); so does a replay, but for the page that crosses from one partition into the next.
-- %(partitions)s and %(segment)s (both NULL: every stream) keep one segment of a partitioned projection's
-- streams (migration 0065); a step then passes over the other segments' events in the same index scan.
-- Gap-free still: the page reads only events below the horizon, which no later commit can add to, so all
-- of them are visible to the statement snapshot that found the floor and the run; an event committed
-- later, wherever it lies, is found by the next page's.
WITH RECURSIVE firsts AS MATERIALIZED (
    SELECT p.from_position, p.to_position, f.transaction_id, f.position
      FROM ledgerflow.event_partitions p
     CROSS JOIN LATERAL (
          SELECT e.transaction_id, e.position FROM ledgerflow.events e
           WHERE e.position >= p.from_position AND e.position < p.to_position
             AND (e.transaction_id, e.position) > (%(transaction_id)s::text::xid8, %(position)s::bigint)
           ORDER BY e.transaction_id, e.position
           LIMIT 1
     ) f
     WHERE p.state = 'attached'
), horizon AS MATERIALIZED (
    SELECT h.xmin,
           h.xmin < pg_snapshot_xmax(pg_current_snapshot())
           AND pg_xact_status(h.xmin) IS DISTINCT FROM 'in progress' AS ended,
           coalesce((SELECT min(f.from_position) FROM firsts f),
                    (SELECT max(p.from_position) FROM ledgerflow.event_partitions p
                      WHERE p.state = 'attached'),
                    1) AS floor,
           a.from_position AS run_from, a.to_position AS run_to,
           CASE WHEN (s.transaction_id, s.position) < (h.xmin, 0) THEN s.transaction_id ELSE h.xmin END
               AS run_below_tx,
           CASE WHEN (s.transaction_id, s.position) < (h.xmin, 0) THEN s.position ELSE 0 END
               AS run_below_position
      FROM (SELECT ledgerflow.log_horizon() AS xmin OFFSET 0) h  -- OFFSET 0: computed once
      LEFT JOIN LATERAL (SELECT f.from_position, f.to_position FROM firsts f
                          ORDER BY f.transaction_id, f.position LIMIT 1) a ON true
      LEFT JOIN LATERAL (SELECT f.transaction_id, f.position FROM firsts f
                          WHERE f.from_position <> a.from_position
                          ORDER BY f.transaction_id, f.position LIMIT 1) s ON true
), page AS (
    SELECT 0 AS n, %(transaction_id)s::text::xid8 AS transaction_id, %(position)s::bigint AS position,
           NULL::text AS tenant, NULL::text AS stream_id, NULL::bigint AS stream_version,
           NULL::uuid AS event_id, NULL::text AS event_type, NULL::text AS data, NULL::text AS metadata,
           NULL::uuid AS correlation_id, NULL::uuid AS causation_id, NULL::timestamptz AS recorded_at,
           0::bigint AS bytes, false AS wide
    UNION ALL
    -- A step that finds no event gives the row that turns the walk wide (same n, cursor and size).
    SELECT p.n + (e.position IS NOT NULL)::int, coalesce(e.transaction_id, p.transaction_id),
           coalesce(e.position, p.position), e.tenant, e.stream_id, e.stream_version, e.event_id,
           e.event_type, e.data, e.metadata, e.correlation_id, e.causation_id, e.recorded_at,
           p.bytes
           + coalesce(octet_length(e.data) + octet_length(e.metadata) + octet_length(e.stream_id) + 256, 0),
           p.wide OR e.position IS NULL
      FROM page p
     CROSS JOIN horizon h
      LEFT JOIN LATERAL (
          SELECT e.transaction_id, e.position, e.tenant, e.stream_id, e.stream_version, e.event_id,
                 e.event_type, e.data::text AS data, e.metadata::text AS metadata, e.correlation_id,
                 e.causation_id, e.recorded_at
            FROM ledgerflow.events e
           WHERE (e.transaction_id, e.position)
                 > (CASE WHEN p.wide
                              AND (p.transaction_id, p.position) < (h.run_below_tx, h.run_below_position)
                         THEN h.run_below_tx ELSE p.transaction_id END,
                    CASE WHEN p.wide
                              AND (p.transaction_id, p.position) < (h.run_below_tx, h.run_below_position)
                         THEN h.run_below_position - 1 ELSE p.position END)
             AND (e.transaction_id, e.position)
                 < (CASE WHEN p.wide THEN h.xmin ELSE h.run_below_tx END,
                    CASE WHEN p.wide THEN 0 ELSE h.run_below_position END)
             AND e.position >= CASE WHEN p.wide THEN h.floor ELSE h.run_from END
             AND e.position < CASE WHEN p.wide THEN 9223372036854775807 ELSE h.run_to END
             AND (%(tenant)s::text IS NULL OR e.tenant = %(tenant)s::text)
             AND (%(types)s::text[] IS NULL OR e.event_type = ANY (%(types)s::text[]))
             AND (%(categories)s::text[] IS NULL OR e.category = ANY (%(categories)s::text[]))
             AND (%(partitions)s::integer IS NULL
                  OR ledgerflow.stream_segment(e.stream_id, %(partitions)s::integer) = %(segment)s::integer)
           ORDER BY e.transaction_id, e.position
           LIMIT 1
     ) e ON true
     WHERE p.n < %(limit)s AND (%(max_bytes)s::bigint IS NULL OR p.bytes < %(max_bytes)s::bigint)
       AND (e.position IS NOT NULL OR NOT p.wide)
)
SELECT h.xmin::text::bigint AS xmin, h.ended, p.bytes, p.position,
       p.transaction_id::text::bigint AS transaction_id, p.tenant, p.stream_id, p.stream_version, p.event_id,
       p.event_type, p.data, p.metadata, p.correlation_id, p.causation_id, p.recorded_at
  FROM horizon h
  LEFT JOIN page p ON p.n > 0 AND p.event_id IS NOT NULL
 ORDER BY p.n

-- name: read_stream_forward
SELECT 0::bigint AS bytes, position, transaction_id::text::bigint AS transaction_id, tenant, stream_id,
       stream_version, event_id, event_type, data::text AS data, metadata::text AS metadata, correlation_id,
       causation_id, recorded_at
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream_id)s AND stream_version >= %(version)s
 ORDER BY stream_version
 LIMIT %(limit)s

-- name: read_stream_backward
SELECT 0::bigint AS bytes, position, transaction_id::text::bigint AS transaction_id, tenant, stream_id,
       stream_version, event_id, event_type, data::text AS data, metadata::text AS metadata, correlation_id,
       causation_id, recorded_at
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream_id)s AND stream_version <= %(version)s
 ORDER BY stream_version DESC
 LIMIT %(limit)s

-- name: read_stream_page
-- A stream's events after %(version)s in the page's direction (filled in by the store: `next_forward` or
-- `next_backward`), at most %(limit)s of them, stopping once their size passes %(max_bytes)s (always with
-- at least one event). As in read_all, one event is taken at a time, so an event beyond the budget is
-- never read.
WITH RECURSIVE page AS (
    SELECT 0 AS n, %(version)s::bigint AS stream_version, NULL::bigint AS position,
           NULL::bigint AS transaction_id, NULL::text AS tenant, NULL::text AS stream_id,
           NULL::uuid AS event_id, NULL::text AS event_type, NULL::text AS data, NULL::text AS metadata,
           NULL::uuid AS correlation_id, NULL::uuid AS causation_id, NULL::timestamptz AS recorded_at,
           0::bigint AS bytes
    UNION ALL
    SELECT p.n + 1, e.stream_version, e.position, e.transaction_id, e.tenant, e.stream_id, e.event_id,
           e.event_type, e.data, e.metadata, e.correlation_id, e.causation_id, e.recorded_at,
           p.bytes + octet_length(e.data) + octet_length(e.metadata) + octet_length(e.stream_id) + 256
      FROM page p
     CROSS JOIN LATERAL (
          SELECT e.stream_version, e.position, e.transaction_id::text::bigint AS transaction_id, e.tenant,
                 e.stream_id, e.event_id, e.event_type, e.data::text AS data, e.metadata::text AS metadata,
                 e.correlation_id, e.causation_id, e.recorded_at
            FROM ledgerflow.events e
           WHERE e.tenant = %(tenant)s AND e.stream_id = %(stream_id)s AND {next}
           LIMIT 1
     ) e
     WHERE p.n < %(limit)s AND (%(max_bytes)s::bigint IS NULL OR p.bytes < %(max_bytes)s::bigint)
)
SELECT bytes, position, transaction_id, tenant, stream_id, stream_version, event_id, event_type, data,
       metadata, correlation_id, causation_id, recorded_at
  FROM page
 WHERE n > 0
 ORDER BY n

-- name: next_forward
e.stream_version > p.stream_version ORDER BY e.stream_version

-- name: next_backward
e.stream_version < p.stream_version ORDER BY e.stream_version DESC

-- name: read_streams
-- Several whole streams in one query (a worker loading every run it just claimed).
SELECT 0::bigint AS bytes, position, transaction_id::text::bigint AS transaction_id, tenant, stream_id,
       stream_version, event_id, event_type, data::text AS data, metadata::text AS metadata, correlation_id,
       causation_id, recorded_at
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = ANY (%(stream_ids)s::text[])
 ORDER BY stream_id, stream_version

-- name: stream_version
SELECT version FROM ledgerflow.streams WHERE tenant = %(tenant)s AND stream_id = %(stream_id)s

-- name: idempotency_key_used
-- Whether a committed append used the key (any content), read without writing.
SELECT 1 FROM ledgerflow.idempotency_keys k WHERE k.tenant = %(tenant)s AND k.key = %(idempotency_key)s

-- name: idempotency_keys_used
-- Which of these keys a committed append used (any content), read without writing.
SELECT k.key FROM ledgerflow.idempotency_keys k WHERE k.tenant = %(tenant)s AND k.key = ANY(%(keys)s::text[])

-- name: earlier_append
-- What an append under an idempotency key answered (see ledgerflow.append_events), read without writing:
-- one row per event, each with the key's request hash. No row if no committed append used the key.
SELECT k.request_hash, r->>0 AS stream_id, (r->>1)::bigint AS stream_version, (r->>2)::bigint AS position,
       (r->>3)::bigint AS transaction_id
  FROM ledgerflow.idempotency_keys k, jsonb_array_elements(k.result) AS r
 WHERE k.tenant = %(tenant)s AND k.key = %(idempotency_key)s

-- name: log_writer
-- Makes the calling transaction a writer of the log (see ledgerflow.log_writer): its first statement in a
-- transaction that writes events by other means than the append statements above (COPY).
SELECT ledgerflow.log_writer()

-- name: bump_streams_for_import
-- Reserves a range of versions per stream for a bulk import. Rows are locked in stream order so a
-- concurrent multi-stream append cannot deadlock with the import.
INSERT INTO ledgerflow.streams AS s (tenant, stream_id, version)
SELECT %(tenant)s, u.stream_id, u.n
  FROM unnest(%(stream_ids)s::text[], %(counts)s::bigint[]) AS u(stream_id, n)
 ORDER BY u.stream_id
ON CONFLICT (tenant, stream_id) DO UPDATE SET version = s.version + excluded.version
RETURNING s.stream_id, s.version

-- name: copy_events
COPY ledgerflow.events (tenant, stream_id, stream_version, event_id, event_type, data, metadata,
                        correlation_id, causation_id)
FROM STDIN

-- name: horizon
-- The safe horizon (ledgerflow.log_horizon), the log's head, and how many committed events wait beyond
-- the horizon because an older writer of the log is still running.
WITH h AS MATERIALIZED (SELECT ledgerflow.log_horizon() AS xmin)
SELECT h.xmin::text::bigint AS xmin,
       coalesce((SELECT max(position) FROM ledgerflow.events), 0) AS head_position,
       (SELECT count(*) FROM ledgerflow.events WHERE transaction_id >= h.xmin) AS waiting_events
  FROM h

-- name: horizon_holders
-- The transactions holding the safe horizon back (ledgerflow.log_holders), oldest first, so an operator
-- can act on them; a prepared transaction shows as pid 0 with its global id.
WITH holders AS MATERIALIZED (SELECT h::xid AS xid FROM ledgerflow.log_holders() AS h)
SELECT * FROM (
    SELECT a.pid, coalesce(a.application_name, '') AS application, coalesce(a.datname, '') AS database,
           coalesce(a.state, '') AS state, a.backend_xid::text::bigint AS transaction_id,
           a.xact_start AS started_at, extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS age_seconds,
           left(coalesce(a.query, ''), 300) AS query
      FROM pg_stat_activity a JOIN holders h ON h.xid = a.backend_xid
    UNION ALL
    SELECT 0, 'prepared transaction ' || p.gid, p.database, 'prepared', p.transaction::text::bigint, p.prepared,
           extract(epoch FROM clock_timestamp() - p.prepared)::float8, ''
      FROM pg_prepared_xacts p JOIN holders h ON h.xid = p.transaction
) found
 ORDER BY 7 DESC
 LIMIT %(limit)s

-- name: events_beyond_horizon
-- Whether the newest committed stamp is at or beyond the horizon, read from the end of the resume-order
-- index (one probe per partition). Asked by every idle projector and subscriber, every few milliseconds
-- while writers are running: an EXISTS with the horizon as a comparison the planner could not bound the
-- index with was planned as a scan of the whole log wherever the partitions' statistics lagged behind
-- their rows (110 ms at 1,000,000 events freshly imported: bench/horizon_check.py).
WITH h AS MATERIALIZED (SELECT ledgerflow.log_horizon() AS xmin)
SELECT coalesce((SELECT e.transaction_id FROM ledgerflow.events e ORDER BY e.transaction_id DESC LIMIT 1)
                >= h.xmin, false)
  FROM h

-- name: notify
-- Sent by the notifier through libpq directly (simple protocol, no parameters, no rows back).
NOTIFY ledgerflow_events

-- name: listen
LISTEN ledgerflow_events

-- name: snapshot_xmax
-- The next transaction id to be handed out: every transaction committed so far has a smaller one.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint

-- name: end_frozen_sessions
-- Sessions of the caller's kind of worker (the same pool application name: processes of one kind share
-- their settings, so their lease length) that have waited on their client inside a transaction for longer
-- than a lease: a frozen process (SIGSTOP, a long pause). The server's
-- idle_in_transaction_session_timeout ends most of them, but not one left mid-pipeline ("active", waiting
-- for the client), one whose idle timer a protocol Flush disarmed, nor one blocked writing an answer the
-- frozen client no longer reads ("active", ClientWrite: an answer larger than the socket buffers, such as
-- a run's events read in the transaction of a node's end); their row locks would keep a peer from taking
-- over for as long as the process stays frozen, and no lock wait shows why. Ended here, their transactions roll back, which
-- is what the timeout would have done. Each is waited for (up to a second) until its backend has exited,
-- so that when this returns its locks are free for the caller to take over.
SELECT pid, application_name, pg_terminate_backend(pid, 1000)
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND application_name = current_setting('application_name')
   AND application_name IN ('ledgerflow-projector', 'ledgerflow-worker', 'ledgerflow-serve')
   AND xact_start IS NOT NULL
   AND (state IN ('idle in transaction', 'idle in transaction (aborted)')
        OR (state = 'active' AND wait_event IN ('ClientRead', 'ClientWrite')))
   AND state_change < clock_timestamp() - make_interval(secs => %(seconds)s)

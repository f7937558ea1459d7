-- The projector's SQL. Every statement the projector package runs is here, named.

-- name: ensure_cursor
INSERT INTO ledgerflow.projection_cursors (projection, version, partitions)
VALUES (%(projection)s, %(version)s, %(partitions)s)
ON CONFLICT (projection) DO NOTHING

-- name: get_cursor
SELECT cursor_tx, cursor_position, version, events_applied, partitions
  FROM ledgerflow.projection_cursors WHERE projection = %(projection)s

-- name: segment_cursors
-- The cursor rows of a partitioned projection's segments (keys `<projection>#<k>`, migration 0065).
SELECT split_part(projection, '#', 2)::integer AS segment, cursor_tx, cursor_position
  FROM ledgerflow.projection_cursors
 WHERE left(projection, length(%(projection)s) + 1) = %(projection)s || '#'
 ORDER BY 1

-- name: lock_segment_cursors
-- Taken by a swap or a verify right after the projection's own row, in segment order: each live batch
-- holds one segment's row only, so the two queue and never deadlock. Once held, no segment moves.
SELECT split_part(projection, '#', 2)::integer AS segment, cursor_tx, cursor_position
  FROM ledgerflow.projection_cursors
 WHERE left(projection, length(%(projection)s) + 1) = %(projection)s || '#'
 ORDER BY 1
   FOR UPDATE

-- name: set_partitions
UPDATE ledgerflow.projection_cursors SET partitions = %(partitions)s WHERE projection = %(projection)s

-- name: reset_segments
-- A swap (holding every row of the projection) puts each segment of the new number at the swap's cursor
-- and removes the rows of segments the new number no longer has.
WITH wanted AS (
    SELECT %(projection)s || '#' || k AS projection FROM generate_series(0, %(partitions)s - 1) k
), gone AS (
    DELETE FROM ledgerflow.projection_cursors c
     WHERE left(c.projection, length(%(projection)s) + 1) = %(projection)s || '#'
       AND c.projection NOT IN (SELECT projection FROM wanted)
)
INSERT INTO ledgerflow.projection_cursors AS c (projection, cursor_tx, cursor_position, version, partitions)
SELECT projection, %(tx)s, %(position)s, %(version)s, %(partitions)s FROM wanted
ON CONFLICT (projection) DO UPDATE
   SET cursor_tx = excluded.cursor_tx, cursor_position = excluded.cursor_position,
       version = excluded.version, partitions = excluded.partitions, updated_at = now()

-- name: lock_cursor
-- Taken first by every transaction that changes a projection's tables, so batches, swaps and replays
-- queue on this row instead of deadlocking on the tables.
SELECT cursor_tx, cursor_position, version
  FROM ledgerflow.projection_cursors WHERE projection = %(projection)s FOR UPDATE

-- name: advance_cursor
-- Compare-and-set: a batch commits only if the cursor is still where the batch started, so a batch is
-- never applied twice, whatever the crash or race.
UPDATE ledgerflow.projection_cursors
   SET cursor_tx = %(new_tx)s, cursor_position = %(new_position)s,
       events_applied = events_applied + %(applied)s, updated_at = now()
 WHERE projection = %(projection)s AND cursor_tx = %(old_tx)s AND cursor_position = %(old_position)s
RETURNING 1

-- name: set_cursor
UPDATE ledgerflow.projection_cursors
   SET cursor_tx = %(tx)s, cursor_position = %(position)s, version = %(version)s, updated_at = now()
 WHERE projection = %(projection)s

-- name: acquire_lease
-- Exactly one worker wins a free or lapsed lease, and it lasts the TTL from the take: see
-- ledgerflow.projection_lease_acquire (migration 0034), which locks the row before it judges and stamps it.
-- The epoch grows on every take. NULL when the lease is held.
SELECT ledgerflow.projection_lease_acquire(%(projection)s, %(owner)s, %(ttl)s)

-- name: renew_lease
-- True while (owner, epoch) still holds the lease; judged and stamped once the row is locked (0034).
SELECT ledgerflow.projection_lease_renew(%(projection)s, %(owner)s, %(epoch)s, %(ttl)s)

-- name: release_lease
UPDATE ledgerflow.projection_leases SET expires_at = clock_timestamp()
 WHERE projection = %(projection)s AND owner = %(owner)s AND epoch = %(epoch)s

-- name: hold_lease
-- Fencing: run at the start of a batch transaction. FOR SHARE keeps a contender from taking the lease
-- until this batch commits; a worker whose lease lapsed or was taken gets no row and commits nothing.
-- The idle-in-transaction timeout (transaction-local) makes the server end this transaction if the
-- worker freezes mid-batch (SIGSTOP, a long GC pause), so the row lock cannot outlive the lease.
SELECT 1 FROM ledgerflow.projection_leases, set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true)
 WHERE projection = %(projection)s AND owner = %(owner)s AND epoch = %(epoch)s
   AND expires_at > clock_timestamp()
   FOR SHARE OF projection_leases

-- name: lease_of
SELECT owner, epoch, expires_at > clock_timestamp() AS alive, heartbeat_at, expires_at
  FROM ledgerflow.projection_leases WHERE projection = %(projection)s

-- name: segment_leases
SELECT split_part(projection, '#', 2)::integer AS segment, owner, expires_at > clock_timestamp() AS alive,
       extract(epoch FROM clock_timestamp() - expires_at)::float8 AS lapsed_for
  FROM ledgerflow.projection_leases
 WHERE left(projection, length(%(projection)s) + 1) = %(projection)s || '#'
 ORDER BY 1

-- name: live_workers
-- Projector workers connected now, counted by the name of their listening connection (one per worker
-- process's worker, held for its whole life): what a worker divides a partitioned projection's segments by.
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = %(application_name)s

-- name: start_run
INSERT INTO ledgerflow.projection_runs
       (projection, kind, trigger, actor, owner, tenant, start_tx, start_position, target_tx, target_position)
VALUES (%(projection)s, %(kind)s, %(trigger)s, %(actor)s, %(owner)s, %(tenant)s, %(start_tx)s,
        %(start_position)s, %(target_tx)s, %(target_position)s)
RETURNING id

-- name: count_run_events
-- What a run goes through: the events after its start cursor up to its target (to the end of the log when
-- it has none), of the types its projection reads, of its tenant only for a tenant's run.
WITH counted AS (
    SELECT count(*) AS n FROM ledgerflow.events
     WHERE (transaction_id, position) > (%(start_tx)s::text::xid8, %(start_position)s)
       AND (%(target_tx)s::bigint IS NULL
            OR (transaction_id, position) <= (%(target_tx)s::text::xid8, %(target_position)s))
       AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
       AND (%(types)s::text[] IS NULL OR event_type = ANY (%(types)s::text[]))
)
UPDATE ledgerflow.projection_runs SET events_total = (SELECT n FROM counted) WHERE id = %(run_id)s
RETURNING events_total

-- name: run_progress
UPDATE ledgerflow.projection_runs
   SET end_tx = %(tx)s, end_position = %(position)s, events_processed = events_processed + %(events)s,
       heartbeat_at = clock_timestamp()
 WHERE id = %(run_id)s AND status = 'running'

-- name: heartbeat_runs
UPDATE ledgerflow.projection_runs SET heartbeat_at = clock_timestamp()
 WHERE owner = %(owner)s AND status = 'running'

-- name: heartbeat_run
UPDATE ledgerflow.projection_runs SET heartbeat_at = clock_timestamp()
 WHERE id = %(run_id)s AND status = 'running'

-- name: finish_run
UPDATE ledgerflow.projection_runs
   SET status = %(status)s, ended_at = clock_timestamp(), error = %(error)s,
       digest = coalesce(%(digest)s, digest)
 WHERE id = %(run_id)s AND status = 'running'

-- name: mark_abandoned_runs
-- A run whose owner stopped heartbeating died with it: say so, instead of showing it running for ever.
UPDATE ledgerflow.projection_runs
   SET status = 'abandoned', ended_at = clock_timestamp(),
       error = 'its owner ' || owner || ' stopped heartbeating at ' || heartbeat_at::text
 WHERE status = 'running' AND heartbeat_at < clock_timestamp() - make_interval(secs => %(timeout)s)
RETURNING id, projection, kind, owner

-- name: scratch_schemas
-- Schemas of rebuild and verify runs (lf_shadow_<projection>_<run>, lf_verify_<projection>_<run>).
SELECT nspname FROM pg_namespace WHERE nspname ~ '^lf_(shadow|verify)_[a-z0-9_]+_[0-9]+$'

-- name: running_run_ids
SELECT id FROM ledgerflow.projection_runs WHERE status = 'running'

-- name: list_runs
SELECT id, projection, kind, trigger, actor, owner, status, start_tx, start_position, end_tx, end_position,
       target_tx, target_position, events_processed, started_at, heartbeat_at, ended_at, digest, error, tenant,
       events_total
  FROM ledgerflow.projection_runs
 WHERE (%(projection)s::text IS NULL OR projection = %(projection)s::text
        OR left(projection, length(%(projection)s::text) + 1) = %(projection)s::text || '#')
   AND (%(tenant)s::text IS NULL OR tenant IS NULL OR tenant = %(tenant)s::text)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: get_run
SELECT id, projection, kind, trigger, actor, owner, status, start_tx, start_position, end_tx, end_position,
       target_tx, target_position, events_processed, started_at, heartbeat_at, ended_at, digest, error, tenant,
       events_total
  FROM ledgerflow.projection_runs WHERE id = %(run_id)s

-- name: record_failure
INSERT INTO ledgerflow.projection_failures AS f
       (projection, event_position, event_tx, event_id, tenant, stream_id, stream_version, event_type,
        policy, error_class, error_message, attempts)
VALUES (%(projection)s, %(position)s, %(tx)s, %(event_id)s, %(tenant)s, %(stream_id)s, %(stream_version)s,
        %(event_type)s, %(policy)s, %(error_class)s, %(error_message)s, %(attempts)s)
ON CONFLICT (projection, event_position) DO UPDATE
   SET status = 'open', error_class = excluded.error_class, error_message = excluded.error_message,
       attempts = f.attempts + excluded.attempts, last_seen = now()
RETURNING id

-- name: open_failures
SELECT id, projection, event_position, event_tx, event_id, tenant, stream_id, stream_version, event_type,
       policy, status, error_class, error_message, attempts, first_seen, last_seen, resolved_at, resolved_by
  FROM ledgerflow.projection_failures
 WHERE projection = %(projection)s AND status IN ('open', 'retry_requested', 'skip_requested')
 ORDER BY event_tx, event_position

-- name: list_failures
-- Failures are tenant data: a tenant sees only those of its own events.
SELECT id, projection, event_position, event_tx, event_id, tenant, stream_id, stream_version, event_type,
       policy, status, error_class, error_message, attempts, first_seen, last_seen, resolved_at, resolved_by
  FROM ledgerflow.projection_failures
 WHERE (%(projection)s::text IS NULL OR projection = %(projection)s::text
        OR left(projection, length(%(projection)s::text) + 1) = %(projection)s::text || '#')
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
   AND (%(all)s OR status IN ('open', 'retry_requested', 'skip_requested'))
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: skipped_positions
SELECT event_position FROM ledgerflow.projection_failures
 WHERE projection = %(projection)s AND status = 'skipped'

-- name: projection_skipped_positions
-- Of a projection and all its segments (a rebuild keeps every segment's skips).
SELECT event_position FROM ledgerflow.projection_failures
 WHERE (projection = %(projection)s OR left(projection, length(%(projection)s) + 1) = %(projection)s || '#')
   AND status = 'skipped'

-- name: projection_open_failures
SELECT id, projection, event_position, event_tx, event_id, tenant, stream_id, stream_version, event_type,
       policy, status, error_class, error_message, attempts, first_seen, last_seen, resolved_at, resolved_by
  FROM ledgerflow.projection_failures
 WHERE (projection = %(projection)s OR left(projection, length(%(projection)s) + 1) = %(projection)s || '#')
   AND status IN ('open', 'retry_requested', 'skip_requested')
 ORDER BY event_tx, event_position

-- name: get_failure
SELECT id, projection, event_position, event_tx, event_id, tenant, stream_id, stream_version, event_type,
       policy, status, error_class, error_message, attempts, first_seen, last_seen, resolved_at, resolved_by
  FROM ledgerflow.projection_failures
 WHERE id = %(failure_id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- name: request_failure_retry
UPDATE ledgerflow.projection_failures SET status = 'retry_requested', resolved_by = %(actor)s
 WHERE id = %(failure_id)s AND status = 'open' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING id

-- name: request_failure_skip
-- The worker carries the skip out (and, under the park policy, applies the stream's parked events).
UPDATE ledgerflow.projection_failures SET status = 'skip_requested', resolved_by = %(actor)s
 WHERE id = %(failure_id)s AND status IN ('open', 'retry_requested')
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING id

-- name: close_failure
UPDATE ledgerflow.projection_failures SET status = %(status)s, resolved_at = now()
 WHERE id = %(failure_id)s

-- name: failure_events
-- The events a resolution applies: the failed event (unless skipped) and the stream's later events that
-- were parked behind it, up to the projection's cursor.
SELECT position, transaction_id::text::bigint AS transaction_id, tenant, stream_id, stream_version, event_id,
       event_type AS type, data, metadata, correlation_id, causation_id, recorded_at
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream_id)s AND stream_version >= %(from_version)s
   AND (transaction_id, position) <= (%(tx)s::text::xid8, %(position)s::bigint)
 ORDER BY stream_version

-- name: lag
-- How far a projection trails: events below the safe horizon not yet applied, events committed at all
-- not yet applied, and the age of the oldest of them; of the types it reads only (its cursor row is not
-- moved over the others while it idles). Counts stop at 1,000,000 to stay cheap.
WITH h AS (SELECT ledgerflow.log_horizon() AS xmin),
behind AS (
    SELECT e.transaction_id, e.recorded_at
      FROM ledgerflow.events e
     WHERE (e.transaction_id, e.position) > (%(tx)s::text::xid8, %(position)s::bigint)
       AND (%(types)s::text[] IS NULL OR e.event_type = ANY (%(types)s::text[]))
     ORDER BY e.transaction_id, e.position
     LIMIT 1000000
)
SELECT (SELECT count(*) FROM behind, h WHERE behind.transaction_id < h.xmin) AS behind_horizon,
       (SELECT count(*) FROM behind) AS behind_head,
       coalesce((SELECT extract(epoch FROM clock_timestamp() - min(recorded_at))::float8 FROM behind), 0.0)
           AS oldest_seconds,
       (SELECT xmin::text::bigint FROM h) AS horizon_xmin

-- name: active_run
SELECT id, target_tx, target_position FROM ledgerflow.projection_runs
 WHERE projection = %(projection)s AND kind = %(kind)s AND status = 'running'
 ORDER BY id DESC LIMIT 1

-- name: running_operator_run
-- The rebuild, replay or verify that holds a scope (all tenants: tenant NULL), if one runs.
SELECT id, kind FROM ledgerflow.projection_runs
 WHERE projection = %(projection)s AND coalesce(tenant, '') = coalesce(%(tenant)s::text, '')
   AND status = 'running' AND kind IN ('rebuild', 'replay', 'verify')
 ORDER BY id DESC LIMIT 1

-- name: first_cursor_since
-- The cursor just before the first event recorded at or after a time, for replays "from a time".
SELECT transaction_id::text::bigint AS transaction_id, position - 1 AS position FROM ledgerflow.events
 WHERE recorded_at >= %(since)s
 ORDER BY transaction_id, position LIMIT 1

-- The partitions of the event log: creating them ahead of need, listing, archiving and restoring them.
-- See migrations/0020_partitioned_event_log.sql.

-- name: ensure
-- Creates partitions until the last one ends at least %(headroom)s positions (NULL: one partition) past
-- the last position handed out; answers where the last partition ends and how wide new ones are.
SELECT ledgerflow.events_ensure_partitions(%(headroom)s::bigint) AS "end",
       (SELECT partition_size FROM ledgerflow.event_partitioning) AS partition_size

-- name: list
-- Sizes of attached partitions come from the catalogue (estimated row counts: exact counts would read
-- every partition); archived ones from what their archive recorded.
SELECT p.name, p.from_position, p.to_position, p.state,
       CASE WHEN p.state = 'archived' THEN p.events
            ELSE (SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
                   WHERE c.oid = to_regclass('ledgerflow.' || quote_ident(p.name))) END AS events,
       CASE WHEN p.state = 'attached'
            THEN pg_total_relation_size(to_regclass('ledgerflow.' || quote_ident(p.name))) END AS bytes,
       p.sha256, p.archived_to, p.archived_at
  FROM ledgerflow.event_partitions p
 ORDER BY p.from_position

-- name: partition
SELECT name, from_position, to_position, state, events, NULL::bigint AS bytes, sha256, archived_to,
       archived_at
  FROM ledgerflow.event_partitions WHERE name = %(name)s

-- name: partition_for_update
SELECT name, from_position, to_position, state, events, NULL::bigint AS bytes, sha256, archived_to,
       archived_at
  FROM ledgerflow.event_partitions WHERE name = %(name)s
   FOR UPDATE

-- name: last_position
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledgerflow.events', 'position')::regclass), 0)

-- name: cursors_behind
-- Projections whose durable cursor has not passed every event of positions [from, to): archiving the
-- partition would take events from under them.
SELECT c.projection, c.cursor_tx, c.cursor_position
  FROM ledgerflow.projection_cursors c
 WHERE EXISTS (SELECT 1 FROM ledgerflow.events e
                WHERE e.position >= %(from)s AND e.position < %(to)s
                  AND (e.transaction_id, e.position) > (c.cursor_tx::text::xid8, c.cursor_position))
 ORDER BY c.projection

-- name: beyond_horizon
-- Events of the range at or beyond the log's horizon: a writer that may still add to them is running.
SELECT count(*) FROM ledgerflow.events
 WHERE position >= %(from)s AND position < %(to)s
   AND transaction_id >= ledgerflow.log_horizon()

-- name: lock_timeout
-- Detaching and attaching wait at most this long for the log's lock, so a long reader never makes
-- appends queue behind an operator's command.
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: restore_table
SELECT ledgerflow.events_partition_table(%(name)s, %(from)s, %(to)s)

-- name: mark_archived
UPDATE ledgerflow.event_partitions
   SET state = 'archived', events = %(events)s, sha256 = %(sha256)s, archived_to = %(archived_to)s,
       archived_at = now()
 WHERE name = %(name)s

-- name: mark_attached
UPDATE ledgerflow.event_partitions SET state = 'attached' WHERE name = %(name)s

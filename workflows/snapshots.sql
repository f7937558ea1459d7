-- Runs' snapshots and light reads of their streams (migrations/0030_run_snapshots.sql): see
-- workflows/snapshots.py.

-- name: read_snapshots
SELECT run_id, version, state::text
  FROM ledgerflow.workflow_run_snapshots
 WHERE tenant = %(tenant)s AND run_id = ANY (%(run_ids)s::uuid[])

-- name: read_runs_after
-- The events of several run streams after a version each (a snapshot's, or 0) and up to another (NULL: to
-- the stream's end), in the columns of a stream read (eventstore's read_stream_forward), at most
-- %(limit)s of them. A signal's payload is left out: the fold keeps a signal by its version, and a node
-- that takes it reads it alone (`read_signal_payload`).
SELECT 0::bigint AS bytes, e.position, e.transaction_id::text::bigint AS transaction_id, e.tenant, e.stream_id,
       e.stream_version, e.event_id, e.event_type,
       CASE WHEN e.event_type = 'wf.SignalReceived' THEN (e.data - 'payload')::text ELSE e.data::text END
           AS data,
       e.metadata::text AS metadata, e.correlation_id, e.causation_id, e.recorded_at
  FROM unnest(%(streams)s::text[], %(after)s::bigint[], %(upto)s::bigint[]) AS s(stream_id, after, upto)
  JOIN ledgerflow.events e
    ON e.tenant = %(tenant)s AND e.stream_id = s.stream_id AND e.stream_version > s.after
   AND e.stream_version <= coalesce(s.upto, 9223372036854775807)
 ORDER BY e.stream_id, e.stream_version
 LIMIT %(limit)s

-- name: write_snapshot
-- A newer snapshot replaces an older one; an older one (a slower concurrent loader) changes nothing.
INSERT INTO ledgerflow.workflow_run_snapshots AS s (tenant, run_id, version, state)
VALUES (%(tenant)s, %(run_id)s, %(version)s, %(state)s::jsonb)
    ON CONFLICT (tenant, run_id) DO UPDATE
   SET version = excluded.version, state = excluded.state, written_at = clock_timestamp()
 WHERE s.version < excluded.version

-- name: read_snapshots_due
-- Of these runs (tenant, run id, the stream version a projection batch reached), those whose snapshot is
-- %(every)s versions or more behind that version, or missing while the run has that many events: with the
-- snapshot's state, if any, to fold onto.
SELECT h.tenant, h.run_id, s.state::text
  FROM unnest(%(tenants)s::text[], %(run_ids)s::uuid[], %(heads)s::bigint[]) AS h(tenant, run_id, head)
  LEFT JOIN ledgerflow.workflow_run_snapshots s ON s.tenant = h.tenant AND s.run_id = h.run_id
 WHERE h.head - coalesce(s.version, 0) >= %(every)s

-- name: write_snapshots
-- `write_snapshot` for several runs in one statement (rows in (tenant, run_id) order: two writers lock
-- them in the same order).
INSERT INTO ledgerflow.workflow_run_snapshots AS s (tenant, run_id, version, state)
SELECT * FROM unnest(%(tenants)s::text[], %(run_ids)s::uuid[], %(versions)s::bigint[], %(states)s::jsonb[])
    ON CONFLICT (tenant, run_id) DO UPDATE
   SET version = excluded.version, state = excluded.state, written_at = clock_timestamp()
 WHERE s.version < excluded.version

-- name: read_signal_payload
SELECT (data -> 'payload')::text
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream_id)s AND stream_version = %(version)s
   AND event_type = 'wf.SignalReceived'

-- name: count_signal
-- One more signal for the run, unless it has had %(limit)s already (then no row: the caller refuses the
-- signal and its transaction, the append included, rolls back).
INSERT INTO ledgerflow.workflow_run_signal_counts AS c (tenant, run_id, signals)
VALUES (%(tenant)s, %(run_id)s, 1)
    ON CONFLICT (tenant, run_id) DO UPDATE SET signals = c.signals + 1
 WHERE c.signals < %(limit)s
RETURNING signals

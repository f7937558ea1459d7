-- Where a run stands with retention (workflows.release_marks): read from its own stream, so that a run whose
-- rows retention removed is still found by id.

-- name: last_mark
-- The run's latest release or restore, if any (a run's stream is bounded: workflows.caps).
SELECT NULL::text AS stream_id, event_type, recorded_at, data ->> 'actor' AS actor, stream_version
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream)s
   AND event_type IN ('wf.RunReleased', 'wf.RunRestored')
 ORDER BY stream_version DESC
 LIMIT 1

-- name: extent
-- How many of the stream's events the log holds now, and its version (from the stream's row, which stays
-- when its events leave with archived partitions, all of them or some): fewer events than the version
-- means some of them are in archived partitions.
SELECT (SELECT count(*) FROM ledgerflow.events
         WHERE tenant = %(tenant)s AND stream_id = %(stream)s) AS events,
       coalesce((SELECT version FROM ledgerflow.streams
                  WHERE tenant = %(tenant)s AND stream_id = %(stream)s), 0) AS last_version

-- name: started
-- The run's start, for the parent it names (a restore links the run to it again).
SELECT data -> 'parent' ->> 'run_id'
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream)s AND stream_version = 1

-- name: last_marks
-- `last_mark` for many runs at once: each run's latest release or restore, if it has one.
SELECT DISTINCT ON (stream_id) stream_id, event_type, recorded_at, data ->> 'actor' AS actor, stream_version
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = ANY(%(streams)s::text[])
   AND event_type IN ('wf.RunReleased', 'wf.RunRestored')
 ORDER BY stream_id, stream_version DESC

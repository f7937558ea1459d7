-- Partitioned projections: one projection's catch-up spread over several workers.
--
-- A projection declared with `partitions = N` (N > 1) splits the stream space into N segments by a stable
-- hash of the stream id. Each segment has its own cursor row, lease and runs, keyed `<projection>#<k>`
-- (projection names never hold '#', so no key of a segment is a projection's name). The projection's own
-- row keeps its version and its number of partitions: a worker whose code says another number refuses to
-- run it until a rebuild (which resets every segment's row) has made them agree.
--
-- The hash is md5 of the stream id, first 28 bits, modulo N: md5 is fixed by its RFC, so the segment of a
-- stream is the same on every server version and platform, and the same in Python (projector/segments.py)
-- as here. (hashtext and hashtextextended are PostgreSQL internals that have changed between versions and
-- differ with the platform's byte order; a stream moving segment after an upgrade could be applied twice.)
-- Computed at read time, so the server filters a segment's events and nothing is stored per event.

ALTER TABLE ledgerflow.projection_cursors
    ADD COLUMN partitions integer NOT NULL DEFAULT 1 CHECK (partitions BETWEEN 1 AND 64);

CREATE FUNCTION ledgerflow.stream_segment(stream_id text, partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (('x' || substr(md5(stream_id), 1, 7))::bit(28)::integer) % partitions
$$;

-- A segment's cursor advance wakes the waiters of its projection (migration 0017): the payload is the
-- projection's name, whichever of its rows advanced, so waiters need not know of segments.
CREATE OR REPLACE FUNCTION ledgerflow.notify_projection_advanced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ledgerflow_projections', split_part(NEW.projection, '#', 1));
    RETURN NULL;
END
$$;

-- Worker presence: while a workflow worker process lives, it holds a session-level advisory lock on a
-- connection of its own. A crash closes that session and PostgreSQL releases the lock at once, so peers
-- can take the dead process's nodes over within a second instead of waiting for its leases to lapse.
--
-- A row here says "this instance's presence lock can be trusted": only instances with a row are ever
-- taken over because their lock is gone. Workers that cannot hold session locks (behind a
-- transaction-mode pooler) register no row and are taken over only when their leases lapse.

-- Lock keys: the second half of the two-key advisory lock (the first is a constant naming "ledgerflow
-- worker presence"). A sequence instead of a hash of the instance id: two live instances never share a key.
CREATE SEQUENCE ledgerflow.worker_presence_keys AS integer MINVALUE 1 CYCLE;

CREATE TABLE ledgerflow.worker_presence (
    instance     text        PRIMARY KEY,
    worker_name  text        NOT NULL,
    lock_key     integer     NOT NULL,
    -- The backend that holds the lock, for operators (pg_stat_activity) and the pooler check.
    backend_pid  integer     NOT NULL,
    -- When the lock was taken: a lock taken before the server last started was lost with it, and its
    -- absence says nothing about the worker (see ledgerflow.wf_worker_presence below).
    since        timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every trusted presence and whether its lock is held now. Trusted: taken since the server last started
-- (a restart drops every session, and with them the locks of workers that are alive and about to
-- reconnect). A row seen here was committed after its lock was taken, so a lock that is free now was
-- released after that: by a session that ended, or by a worker that deregistered (it deletes its row
-- first). Whether it is free is asked of the lock manager directly: a shared transaction-level try-lock
-- is refused at once while the worker holds its exclusive lock, and is granted (then released with the
-- caller's transaction) once it is gone. That costs microseconds, where reading pg_locks costs in
-- proportion to every lock on the server.
-- The first key of the presence lock is 1279678288 ("LFWP"), in workflows/recovery.sql as well.
CREATE FUNCTION ledgerflow.wf_worker_presence()
RETURNS TABLE (instance text, worker_name text, alive boolean) LANGUAGE sql AS $$
    SELECT p.instance, p.worker_name, NOT pg_try_advisory_xact_lock_shared(1279678288, p.lock_key)
      FROM ledgerflow.worker_presence p
     WHERE p.since > pg_postmaster_start_time()
$$;

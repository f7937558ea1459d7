-- Recovery of orphaned work and worker presence. Every statement that recovery and presence run is here.

-- name: reclaim
-- Takes back, in one statement, the nodes whose holder is gone:
--   * held by an earlier process of this worker name (a restart: that process is gone, unless it still
--     holds its presence lock, as two live processes given one name by mistake would);
--   * held by a process whose presence lock is gone (its session closed: it crashed);
--   * whose lease lapsed (a hung or partitioned worker, or one without a trusted presence).
-- A live worker keeps its nodes: its lease holds and its lock is held. SKIP LOCKED: with several
-- recoverers, each row goes to exactly one, and a row a fenced write is committing is left for later.
-- A node that crashed too often is parked. The others are ready again, except that up to
-- %(claim_slots)s of them, of the recoverer's own workflows, are claimed for it at once (fresh fencing
-- token, new lease): a restarted worker, or a peer taking a dead one over, then starts them without a
-- second transaction that would claim them again.
WITH presence AS (
    SELECT instance, alive FROM ledgerflow.wf_worker_presence()
), lapsed AS (
    SELECT q.run_id, q.node, q.lease_expires_at, q.worker_name AS previous_worker,
           q.crashes + 1 <= q.max_crashes
           -- Claimed for the recoverer only if it has the run's version (migration 0016).
           AND (q.workflow, q.version) IN (SELECT * FROM unnest(%(claim_workflows)s::text[],
                                                                %(claim_versions)s::text[]))
           -- Never a node with limits: it needs a slot of each, which only the claim admits.
           AND NOT EXISTS (SELECT 1 FROM ledgerflow.workflow_node_limits nl
                            WHERE nl.workflow = q.workflow AND nl.node = q.node) AS claimable,
           CASE WHEN q.worker_name = %(worker_name)s AND q.worker_instance <> %(instance)s
                     AND q.worker_instance NOT IN (SELECT instance FROM presence WHERE alive)
                THEN 'worker_restarted'
                WHEN q.worker_instance IN (SELECT instance FROM presence WHERE NOT alive)
                THEN 'worker_gone'
                ELSE 'lease_expired' END AS reason
      FROM ledgerflow.workflow_queue q
     WHERE q.status = 'claimed'
       AND (q.lease_expires_at < clock_timestamp()
            OR (q.worker_name = %(worker_name)s AND q.worker_instance <> %(instance)s
                AND q.worker_instance NOT IN (SELECT instance FROM presence WHERE alive))
            OR q.worker_instance IN (SELECT instance FROM presence WHERE NOT alive))
     ORDER BY q.lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE OF q SKIP LOCKED
), checked AS (
    -- Never a node of a paused run: it starts no new node. Its row becomes ready, and the claim moves it
    -- aside until the run is resumed. Asked once the row is locked, with a snapshot of its own (see
    -- migration 0049).
    SELECT lapsed.*, claimable AND NOT ledgerflow.wf_run_paused(run_id) AS can_claim FROM lapsed
), taken AS (
    -- (A window function cannot sit beside FOR UPDATE: the rows are locked first, then counted.)
    SELECT run_id, node, previous_worker, reason,
           can_claim AND row_number() OVER (PARTITION BY can_claim ORDER BY lease_expires_at)
                         <= %(claim_slots)s AS claim
      FROM checked
)
UPDATE ledgerflow.workflow_queue q
   SET status = CASE WHEN t.claim THEN 'claimed'
                     WHEN q.crashes + 1 > q.max_crashes THEN 'parked' ELSE 'ready' END,
       crashes = q.crashes + 1, ready_at = clock_timestamp(),
       attempt = CASE WHEN t.claim THEN q.attempt + 1 ELSE q.attempt END,
       token = CASE WHEN t.claim THEN nextval('ledgerflow.workflow_fencing_tokens') END,
       worker_name = CASE WHEN t.claim THEN %(worker_name)s ELSE q.worker_name END,
       worker_instance = CASE WHEN t.claim THEN %(instance)s END,
       claimed_at = CASE WHEN t.claim THEN clock_timestamp() ELSE q.claimed_at END,
       heartbeat_at = CASE WHEN t.claim THEN clock_timestamp() ELSE q.heartbeat_at END,
       progress_at = CASE WHEN t.claim THEN clock_timestamp() ELSE q.progress_at END,
       lease_expires_at = CASE WHEN t.claim THEN clock_timestamp() + make_interval(secs => %(ttl)s) END
  FROM taken t
 WHERE q.run_id = t.run_id AND q.node = t.node
RETURNING q.run_id, q.node, q.tenant, q.workflow,
          CASE WHEN t.claim THEN q.attempt - 1 ELSE q.attempt END AS lost_attempt,
          q.crashes, q.status, t.previous_worker, t.reason, q.token, q.cancel_requested, q.version

-- name: forget_departed
-- A dead process's presence row goes once none of its nodes is left to take back; so does a row from
-- before the server's last start (its worker registers again if it lives; until then its leases count).
DELETE FROM ledgerflow.worker_presence p
 WHERE (p.instance IN (SELECT instance FROM ledgerflow.wf_worker_presence() WHERE NOT alive)
        OR p.since <= pg_postmaster_start_time())
   AND NOT EXISTS (SELECT 1 FROM ledgerflow.workflow_queue q
                    WHERE q.status = 'claimed' AND q.worker_instance = p.instance)

-- name: stuck
-- Nodes whose worker still heartbeats but which have reported nothing for longer than their deadline.
WITH stuck AS (
    SELECT run_id, node FROM ledgerflow.workflow_queue
     WHERE status = 'claimed' AND progress_deadline IS NOT NULL
       AND progress_at < clock_timestamp() - make_interval(secs => progress_deadline)
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE ledgerflow.workflow_queue q
   SET status = CASE WHEN q.on_stuck = 'retry' THEN 'ready' ELSE q.status END,
       ready_at = clock_timestamp(), token = CASE WHEN q.on_stuck = 'retry' THEN NULL ELSE q.token END,
       worker_instance = CASE WHEN q.on_stuck = 'retry' THEN NULL ELSE q.worker_instance END,
       crashes = CASE WHEN q.on_stuck = 'retry' THEN q.crashes + 1 ELSE q.crashes END,
       progress_at = clock_timestamp()
  FROM stuck
 WHERE q.run_id = stuck.run_id AND q.node = stuck.node
RETURNING q.run_id, q.node, q.tenant, q.attempt, q.on_stuck AS action, q.token, q.worker_name AS worker,
          extract(epoch FROM clock_timestamp() - q.claimed_at)::float8 AS seconds

-- name: record_recovery
INSERT INTO ledgerflow.workflow_recoveries
       (worker, trigger, started_at, duration_ms, found, reclaimed, parked, stuck, failed)
VALUES (%(worker)s, %(trigger)s, %(started_at)s, %(duration_ms)s, %(found)s, %(reclaimed)s, %(parked)s,
        %(stuck)s, %(failed)s)

-- name: presence_register
-- Runs on the worker's own presence connection. The lock is taken before the row commits, so no peer
-- ever sees the row of a live process without its lock (which would read as a crash).
WITH fresh AS (
    SELECT nextval('ledgerflow.worker_presence_keys')::integer AS lock_key
), locked AS (
    SELECT lock_key FROM fresh WHERE pg_try_advisory_lock(1279678288, lock_key)
)
INSERT INTO ledgerflow.worker_presence AS p (instance, worker_name, lock_key, backend_pid)
SELECT %(instance)s, %(worker_name)s, lock_key, pg_backend_pid() FROM locked
    ON CONFLICT (instance) DO UPDATE
   SET lock_key = excluded.lock_key, backend_pid = excluded.backend_pid, since = clock_timestamp()
RETURNING p.lock_key, p.backend_pid

-- name: presence_seen_by_others
-- Runs on another connection: the presence lock is held by the backend that took it, and that backend is
-- not this one. Behind a transaction-mode pooler, client connections share backends, and one of the two
-- fails.
SELECT pg_backend_pid() <> %(backend_pid)s
       AND EXISTS (SELECT 1 FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                      AND l.classid = 1279678288::oid AND l.objid = %(lock_key)s::oid
                      AND l.pid = %(backend_pid)s)

-- name: presence_watch
-- The peers' check, a few times a second on the presence connection itself (no pool checkout), under
-- 0.1 ms of server time: whether this connection is still on the backend that holds this process's lock
-- (a pooler moves clients between backends; a session lock never leaves its backend), and whether there
-- are orphans to take back: another registered process is gone, or a lease lapsed (the oldest lease is
-- the first entry of the leases index), so a hung worker's nodes go once its lease lapses, not at the
-- next periodic sweep.
SELECT pg_backend_pid() = %(backend_pid)s AS still_held,
       EXISTS (SELECT 1 FROM ledgerflow.wf_worker_presence()
                WHERE NOT alive AND instance <> %(instance)s)
       OR EXISTS (SELECT 1 FROM ledgerflow.workflow_queue
                   WHERE status = 'claimed' AND lease_expires_at < clock_timestamp()) AS orphans

-- name: presence_watch_only
-- The same check for a process that cannot hold a presence of its own (it still takes orphans over).
SELECT EXISTS (SELECT 1 FROM ledgerflow.wf_worker_presence()
                WHERE NOT alive AND instance <> %(instance)s)
       OR EXISTS (SELECT 1 FROM ledgerflow.workflow_queue
                   WHERE status = 'claimed' AND lease_expires_at < clock_timestamp()) AS orphans

-- name: presence_deregister
-- A clean stop: the row goes first, then the lock (by closing the session), so no peer reads the stop
-- as a crash.
DELETE FROM ledgerflow.worker_presence WHERE instance = %(instance)s

-- name: presence_unlock
SELECT pg_advisory_unlock(1279678288, %(lock_key)s) FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = 1279678288::oid
   AND l.objid = %(lock_key)s::oid AND l.pid = pg_backend_pid()

-- name: presence_namesakes
-- Other live processes registered under this worker's name: two processes given one name by mistake.
-- They work correctly (each claims as its own instance), but logs and the console cannot tell them apart.
SELECT instance FROM ledgerflow.wf_worker_presence()
 WHERE worker_name = %(worker_name)s AND instance <> %(instance)s AND alive

-- name: shared_worker_names
-- Every name that more than one live worker process has registered under, with how many.
SELECT worker_name, count(*)::int AS processes FROM ledgerflow.wf_worker_presence()
 WHERE alive
 GROUP BY worker_name
HAVING count(*) > 1
 ORDER BY worker_name

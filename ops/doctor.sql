-- Statements of ops/doctor.py.

-- name: ping
SELECT 1

-- name: listeners
-- Every running worker holds one LISTEN connection, named for its kind (eventstore/keepalive.py).
SELECT application_name, count(*) AS connections
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name IN ('ledgerflow-projector-listener', 'ledgerflow-workflow-listener')
 GROUP BY application_name

-- name: connection_slots
-- Slots in use against the slots ordinary roles may use (the rest are kept for superusers).
SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS used,
       current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
           AS usable

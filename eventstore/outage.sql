-- Statements of eventstore/outage.py.

-- name: ping
SELECT 1

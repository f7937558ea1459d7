-- The SQL of waiting for a projection (projector/waiting.py). Cursor advances notify this channel
-- (migration 0017).

-- name: listen_projections
LISTEN ledgerflow_projections

-- name: unlisten_projections
UNLISTEN ledgerflow_projections

-- Tenant fences of per-tenant projections (migration 0036 explains the protocol and its guarantee).
-- A fence is kept under the key of what a cursor row covers: the projection's name, or for a partitioned
-- projection one fence per segment under the segment's key `<projection>#<k>` (migration 0065), each at
-- that segment's cursor (see projector/tenant_rebuild.py). `split_part(projection, '#', 1)` is the
-- projection of either kind of key.

-- name: fence_tenant
-- Run right after locking the key's cursor row, in its transaction: a batch in flight has committed, and
-- every later batch reads this row after its compare-and-set of the cursor.
INSERT INTO ledgerflow.projection_tenant_fences (projection, tenant, run_id, cursor_tx, cursor_position)
VALUES (%(key)s, %(tenant)s, %(run_id)s, %(cursor_tx)s, %(cursor_position)s)

-- name: fences_of
-- Read by every live batch after its compare-and-set (so under its key's cursor row lock): the tenants
-- whose events it leaves, and whether each fence's run still runs (a fence whose run ended is lifted).
SELECT f.tenant, f.run_id, f.cursor_tx, f.cursor_position, coalesce(r.status = 'running', false) AS running
  FROM ledgerflow.projection_tenant_fences f
  LEFT JOIN ledgerflow.projection_runs r ON r.id = f.run_id
 WHERE f.projection = %(key)s

-- name: lift_fence
DELETE FROM ledgerflow.projection_tenant_fences
 WHERE projection = %(key)s AND tenant = %(tenant)s AND run_id = %(run_id)s

-- name: lock_run_fences
-- The replacement's hold on its own fences (one, or one per segment), in key order as lock_fences: a swap
-- of the whole projection that resets them (reset_fences) waits for it, and the replacement builds
-- to the cursors it reads here.
SELECT projection, cursor_tx, cursor_position
  FROM ledgerflow.projection_tenant_fences
 WHERE split_part(projection, '#', 1) = %(projection)s AND tenant = %(tenant)s AND run_id = %(run_id)s
 ORDER BY projection
   FOR UPDATE

-- name: take_fences
-- A swap of the whole projection (under its cursor rows' locks) has put every tenant's rows at its cursor:
-- each fenced tenant's fences are taken out here and put back at that cursor, one per cursor row of the
-- number of partitions the swap built (`reset_fences`).
DELETE FROM ledgerflow.projection_tenant_fences
 WHERE split_part(projection, '#', 1) = %(projection)s
RETURNING tenant, run_id

-- name: any_fence
SELECT EXISTS (
    SELECT 1 FROM ledgerflow.projection_tenant_fences WHERE split_part(projection, '#', 1) = %(projection)s
)

-- name: lock_fences
-- Taken by a swap of the whole projection right after its cursor rows, before the live tables: a tenant's
-- replacement holding its fences (lock_run_fences) finishes first, and no lock is taken in the other order.
SELECT tenant
  FROM ledgerflow.projection_tenant_fences
 WHERE split_part(projection, '#', 1) = %(projection)s
 ORDER BY projection, tenant
   FOR UPDATE

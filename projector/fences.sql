-- Tenant fences of per-tenant projections (migration 0036 explains the protocol and its guarantee).

-- name: fence_tenant
-- Run right after lock_cursor, in its transaction: a batch in flight has committed, and every later batch
-- reads this row after its compare-and-set of the cursor.
INSERT INTO ledgerflow.projection_tenant_fences (projection, tenant, run_id, cursor_tx, cursor_position)
VALUES (%(projection)s, %(tenant)s, %(run_id)s, %(cursor_tx)s, %(cursor_position)s)

-- name: fences_of
-- Read by every live batch after its compare-and-set (so under the cursor row lock): the tenants whose
-- events it leaves, and whether each fence's run still runs (a fence whose run ended is lifted).
SELECT f.tenant, f.run_id, f.cursor_tx, f.cursor_position, coalesce(r.status = 'running', false)
  FROM ledgerflow.projection_tenant_fences f
  LEFT JOIN ledgerflow.projection_runs r ON r.id = f.run_id
 WHERE f.projection = %(projection)s

-- name: lift_fence
DELETE FROM ledgerflow.projection_tenant_fences
 WHERE projection = %(projection)s AND tenant = %(tenant)s AND run_id = %(run_id)s

-- name: lock_fence
-- The replacement's hold on its own fence: a swap of the whole projection that moves the fence's cursor
-- (move_fences) waits for it, and the replacement builds to the cursor it reads here.
SELECT cursor_tx, cursor_position
  FROM ledgerflow.projection_tenant_fences
 WHERE projection = %(projection)s AND tenant = %(tenant)s AND run_id = %(run_id)s
   FOR UPDATE

-- name: move_fences
-- A swap of the whole projection (under the cursor row lock) has put every tenant's rows at its cursor: a
-- fenced tenant's rows now stand there too.
UPDATE ledgerflow.projection_tenant_fences
   SET cursor_tx = %(cursor_tx)s, cursor_position = %(cursor_position)s
 WHERE projection = %(projection)s

-- name: any_fence
SELECT EXISTS (SELECT 1 FROM ledgerflow.projection_tenant_fences WHERE projection = %(projection)s)

-- name: lock_fences
-- Taken by a swap of the whole projection right after the cursor row, before the live tables: a tenant's
-- replacement holding its fence (lock_fence) finishes first, and no lock is taken in the other order.
SELECT tenant FROM ledgerflow.projection_tenant_fences WHERE projection = %(projection)s FOR UPDATE

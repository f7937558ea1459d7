-- A tenant's rows of a per-tenant projection are rebuilt without stopping the projection for the other
-- tenants.
--
-- Before, the rebuild of one tenant's rows replaced them while holding the projection's cursor row, so
-- every tenant's events waited for the whole replacement (a delete and an insert of all that tenant's rows,
-- then their digest). Now the rebuild fences the tenant instead:
--
-- 1. Fence: holding the cursor row for one insert (any batch in flight commits first), the rebuild records
--    the tenant and the live cursor C. From then on every live batch leaves that tenant's events unapplied
--    and moves the cursor on over the other tenants' events: it reads the fences after its compare-and-set
--    of the cursor, under the same row lock, so a batch either committed before the fence (C covers it) or
--    sees it.
-- 2. Replace: the tenant's rows are replaced by the rebuilt copy, built to exactly C, in a transaction
--    that holds no lock any other tenant's batch needs (no batch writes a fenced tenant's rows).
-- 3. Lift: holding the cursor row again, the tenant's own events after C up to the live cursor (those the
--    batches left, typically a handful) are applied to its rows and the fence is deleted, in one
--    transaction.
--
-- The guarantee: a rebuild of tenant T's rows holds the cursor row only for the fence's insert and for
-- applying T's own events appended during the replacement; other tenants' events are applied meanwhile.
-- The price, paid by T alone: between the fence and its lift, T's rows of the projection show its state
-- at C while the cursor moves on. A fence whose run is no longer running (its process died) is lifted by
-- the live batch that meets it, in the same way, so no tenant stays fenced.

CREATE TABLE ledgerflow.projection_tenant_fences (
    projection      text        NOT NULL,
    tenant          text        NOT NULL,
    run_id          bigint      NOT NULL REFERENCES ledgerflow.projection_runs (id),
    cursor_tx       bigint      NOT NULL,
    cursor_position bigint      NOT NULL,
    fenced_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, tenant)
);

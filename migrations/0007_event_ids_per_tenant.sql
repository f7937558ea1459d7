-- Event ids are unique within a tenant's log, not across the whole log: an append that reuses an id of
-- another tenant is not refused, so a refusal never tells one tenant which ids another tenant used.
-- Within one tenant a reused id is still refused (duplicate_event_id), and idempotency keys are per
-- tenant as before. ledgerflow.append_events needs no change: it inserts, and this constraint refuses.
ALTER TABLE ledgerflow.events
    ADD CONSTRAINT events_tenant_event_id_unique UNIQUE (tenant, event_id);
ALTER TABLE ledgerflow.events DROP CONSTRAINT events_event_id_unique;

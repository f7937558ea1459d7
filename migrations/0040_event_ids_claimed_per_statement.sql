-- Event ids are claimed once per statement, not once per row.
--
-- 0020 kept "an event id is unique within its tenant's log" across partitions with ledgerflow.event_ids
-- (primary key events_tenant_event_id_unique), filled by a BEFORE INSERT row trigger: one plpgsql call and
-- one single-row INSERT per event, which was more than half of the server time of a 2,000-event append.
-- Now one AFTER INSERT statement trigger on the log reads the statement's new rows (a transition table,
-- which PostgreSQL fills in C as it writes them) and claims all their ids with one INSERT ... SELECT: the
-- same table, the same primary key, so a reused id is refused with the same constraint name and the same
-- typed error (DuplicateEventIdError), and the statement, hence the append, with it.
--
-- Why a statement trigger rather than an INSERT written into each append statement: every path that writes
-- the log is covered without being told, as before: append_events, the one-stream statements, COPY imports,
-- the workflow functions that append in their own statements (run start, claims, node end) and plain
-- INSERTs. Writing the claim into each of them would leave the guarantee to whoever writes the next one.
--
-- What holds:
--   * Within a tenant, an id is taken once, for ever: two events with the same id in one append, or in
--     two appends, committed or not, never both commit. ids of archived partitions stay in event_ids
--     (archiving drops the partition, not its ids), so they stay taken; a restore loads its rows into a
--     standalone table before attaching it, so it claims nothing again.
--   * Two appends racing for one id under READ COMMITTED: the second one's INSERT into event_ids waits on
--     the first one's index entry, then fails with unique_violation if the first commits, or goes on if it
--     rolls back. Exactly one commits it.
--   * The ids are claimed in (tenant, event_id) order, whatever order the events are in, so two appends
--     that share several ids always lock them in the same order: one of them gets the duplicate error,
--     neither a deadlock.
--   * Across tenants an id may repeat, and a refusal names nothing of another tenant.
--   * Not covered: an INSERT aimed at a partition by its name (statement triggers of the parent do not
--     fire for it). Nothing in ledgerflow writes a partition directly except a restore, before attaching.

CREATE FUNCTION ledgerflow.claim_event_ids() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Uniqueness of (tenant, event_id) across partitions: the primary key of event_ids refuses a reused
    -- id (events_tenant_event_id_unique). Sorted, so concurrent claims of shared ids cannot deadlock.
    INSERT INTO ledgerflow.event_ids (tenant, event_id)
    SELECT n.tenant, n.event_id FROM new_events n ORDER BY n.tenant, n.event_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_claim_event_ids
    AFTER INSERT ON ledgerflow.events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION ledgerflow.claim_event_ids();
-- As the trigger it replaces: it fires under session_replication_role = replica too.
ALTER TABLE ledgerflow.events ENABLE ALWAYS TRIGGER events_claim_event_ids;

DROP TRIGGER events_claim_event_id ON ledgerflow.events;
DROP FUNCTION ledgerflow.claim_event_id();

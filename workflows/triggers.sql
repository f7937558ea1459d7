-- Statements of workflows.triggers. `{table}` is the trigger projection's table: its live copy, or the
-- shadow copy while it is rebuilt (see projector.projection.ApplyContext).

-- name: create_starts
-- One row per event that started a run: the record of which run each event started, kept with the
-- trigger's cursor in one transaction.
CREATE TABLE {table} (
    tenant         text NOT NULL,
    event_id       uuid NOT NULL,
    run_id         uuid NOT NULL,
    transaction_id bigint NOT NULL,
    position       bigint NOT NULL,
    PRIMARY KEY (tenant, event_id)
)

-- name: record_start
-- A replay re-applies events whose runs exist: the idempotent start returns the same run, and the row
-- is already there.
INSERT INTO {table} (tenant, event_id, run_id, transaction_id, position)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (tenant, event_id) DO NOTHING

-- name: started_by
-- The run an event started, if its trigger has applied it.
SELECT run_id FROM {table} WHERE tenant = %s AND event_id = %s

-- Debounced starts: `Engine.start(..., debounce=Debounce(key, window))`. A burst of starts with the same
-- (tenant, workflow, key) is one row here; each start of the burst keeps the latest input and moves the
-- row's due time to `window` after itself (never beyond the burst's deadline, from `max_wait`). Once due,
-- a worker takes the row (FOR UPDATE SKIP LOCKED), starts the burst's one run and deletes the row in one
-- transaction: a crash at any moment leaves the row (the run starts later) or the run (the row is gone),
-- never both and never neither. The run's idempotency key `debounce:<burst>` is a second guard.

CREATE TABLE ledgerflow.workflow_debounces (
    tenant       text        NOT NULL,
    workflow     text        NOT NULL,
    key          text        NOT NULL,
    -- Names the burst's run: its id is derived from the idempotency key `debounce:<burst>`.
    burst        uuid        NOT NULL,
    input        jsonb,
    starts       integer     NOT NULL DEFAULT 1,
    first_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    due_at       timestamptz NOT NULL,
    -- The latest the run may start, whatever starts keep coming (infinity: no such bound).
    deadline     timestamptz NOT NULL,
    PRIMARY KEY (tenant, workflow, key)
);
CREATE INDEX workflow_debounces_due ON ledgerflow.workflow_debounces (due_at);

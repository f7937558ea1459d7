-- Schedules of workflows (workflows.schedules): one row per scheduled workflow and tenant, with the last
-- tick whose run was started. A worker advances `last_tick` under the row's lock (SELECT ... FOR UPDATE
-- SKIP LOCKED), so at any moment one worker decides a schedule's ticks; each tick's run is started with the
-- idempotency key 'schedule:<workflow>:<tick>', so a worker that dies between starting a run and moving
-- `last_tick` cannot make a second run of that tick.
CREATE TABLE ledgerflow.workflow_schedules (
    tenant      text NOT NULL,
    workflow    text NOT NULL,
    -- What the definition said when the row was last advanced (a changed cron goes on from last_tick).
    cron        text NOT NULL,
    catch_up    text NOT NULL,
    last_tick   timestamptz NOT NULL,
    last_run_id uuid,
    ticks_started bigint NOT NULL DEFAULT 0,
    ticks_skipped bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, workflow)
);

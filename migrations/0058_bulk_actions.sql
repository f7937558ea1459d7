-- Bulk operator actions: one row per cancel or retry (or any later kind) of every run a search filter
-- keeps. The row is the action's record (who, when, what, for which tenant) and its progress: the keyset
-- position of the last run it processed, so that a resumed action continues below it, and its counts.
-- `kind` is checked by workflows.bulk (its table of kinds), so that a new kind needs no migration.
CREATE TABLE ledgerflow.bulk_actions (
    id              uuid        PRIMARY KEY,
    tenant          text        NOT NULL,
    kind            text        NOT NULL,
    actor           text        NOT NULL,
    filter          jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'running'
                    CHECK (state IN ('running', 'completed', 'failed')),
    matched         integer     NOT NULL CHECK (matched >= 0),
    -- The most runs the action processes (the bulk_max_runs setting when it was recorded).
    max_runs        integer     NOT NULL CHECK (max_runs >= 1),
    -- The newest run matched when the action was recorded: runs started later are not the action's.
    top_created_at  timestamptz,
    top_run_id      uuid,
    done            integer     NOT NULL DEFAULT 0,
    failed          integer     NOT NULL DEFAULT 0,
    skipped         integer     NOT NULL DEFAULT 0,
    -- The keyset position (run start time, run id) of the last run processed; null before the first.
    last_created_at timestamptz,
    last_run_id     uuid,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);
CREATE INDEX bulk_actions_by_tenant ON ledgerflow.bulk_actions (tenant, created_at DESC);

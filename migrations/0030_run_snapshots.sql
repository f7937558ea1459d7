-- A run's folded state at a version of its stream, and a run's count of signals.
--
-- Loading a run used to read and fold its whole stream: the cost of a read grew with the run's history
-- (signals, checkpoints, progress), whatever the answer needed. `workflow_run_snapshots` keeps the fold's
-- state (workflows.state.RunState, without signal payloads: a signal is kept by its stream version) as of
-- `version`; a load reads the snapshot and folds only the events after it (workflows.snapshots).
--
-- A snapshot is a pure function of the first `version` events of an append-only stream, so any process
-- that folded them may write it, and a newer one only replaces an older one: the row is a cache, never a
-- source of truth. Dropping every row loses nothing but time.
CREATE TABLE ledgerflow.workflow_run_snapshots (
    tenant      text        NOT NULL,
    run_id      uuid        NOT NULL,
    version     bigint      NOT NULL CHECK (version > 0),
    state       jsonb       NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, run_id)
);

-- Signals received per run, counted as they are recorded (in the signal's transaction), so that the cap
-- on signals per run (LEDGERFLOW_MAX_SIGNALS_PER_RUN) is checked without reading the run's stream. Runs
-- signalled before this migration count from zero.
CREATE TABLE ledgerflow.workflow_run_signal_counts (
    tenant      text   NOT NULL,
    run_id      uuid   NOT NULL,
    signals     int    NOT NULL CHECK (signals >= 0),
    PRIMARY KEY (tenant, run_id)
);

-- The API server picks up bulk actions that stopped (their process was killed) on start and every few
-- seconds (ops.api.bulk_resume): this index finds the few running actions among every action ever recorded.
CREATE INDEX bulk_actions_running ON ledgerflow.bulk_actions (updated_at) WHERE state = 'running';

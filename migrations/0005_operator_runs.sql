-- Operator runs (rebuild, replay, verify) per scope: a run names the tenant whose rows it touches, or
-- none when it covers every tenant.
ALTER TABLE ledgerflow.projection_runs ADD COLUMN tenant text;

-- One rebuild, replay or verify of a projection at a time per scope (all tenants, or one tenant's rows):
-- a second request is refused with the running run's id. Verify joins the rule, so concurrent verifies
-- no longer race on one scratch schema (each run also has its own; see projector.tables).
DROP INDEX ledgerflow.projection_runs_one_rebuild;
CREATE UNIQUE INDEX projection_runs_one_operator_run
    ON ledgerflow.projection_runs (projection, coalesce(tenant, ''))
    WHERE status = 'running' AND kind IN ('rebuild', 'replay', 'verify');
CREATE INDEX projection_failures_by_tenant ON ledgerflow.projection_failures (tenant, id DESC);

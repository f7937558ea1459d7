-- Per-tenant quotas: runs in flight, starts per second and appends per second. The defaults are settings
-- (LEDGERFLOW_TENANT_MAX_RUNS_IN_FLIGHT, _STARTS_PER_SECOND, _APPENDS_PER_SECOND); a row here overrides
-- them for one tenant, column by column (NULL: the setting applies). Processes read this table every few
-- seconds (LEDGERFLOW_TENANT_QUOTAS_REFRESH), not at every request.

CREATE TABLE ledgerflow.tenant_quotas (
    tenant              text             PRIMARY KEY,
    max_runs_in_flight  integer          CHECK (max_runs_in_flight >= 1),
    starts_per_second   double precision CHECK (starts_per_second > 0),
    appends_per_second  double precision CHECK (appends_per_second > 0),
    updated_at          timestamptz      NOT NULL DEFAULT clock_timestamp()
);

-- A tenant's runs in flight are its runs with a queue row (ready, claimed, waiting or parked): a run has
-- one from its start until it ends, in the transactions that record both. Counting them walks this index,
-- and only as far as the quota: a tenant's backlog never makes another tenant's admission slower.
CREATE INDEX workflow_queue_by_tenant ON ledgerflow.workflow_queue (tenant, run_id);

-- The admission of a tenant's new run under its quota of p_limit runs in flight, in the transaction that
-- starts the run, before its events are appended: fails with LFQ01 (the transaction then rolls back, and
-- nothing of the start is written) when the tenant has p_limit runs in flight already. A statement that
-- fails needs no answer read before the start's own statements are sent: a start sends them all at once.
--
-- Exact across processes: a transaction-level advisory lock per tenant (1279677521, "LFTQ"; the tenant's
-- hash picks the lock) serialises the admissions of that tenant until the admitting transaction commits or
-- rolls back, so two starts can never both take the last free place. The count is read after the lock is
-- granted, with a fresh snapshot (a statement of a volatile function), so it includes every start admitted
-- earlier, committed by then. Runs that end meanwhile only make the count too high, never too low. Other
-- tenants take other locks: their starts never wait here (two tenants that share a hash wait on each
-- other, which is slower, never wrong). Tenants without this quota never call it. The count walks the
-- tenant's queue rows only as far as p_limit runs.
CREATE FUNCTION ledgerflow.wf_admit_run(p_tenant text, p_limit int)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_in_flight int;
BEGIN
    PERFORM pg_advisory_xact_lock(1279677521, hashtext(p_tenant));
    SELECT count(*) INTO v_in_flight
      FROM (SELECT DISTINCT q.run_id FROM ledgerflow.workflow_queue q
             WHERE q.tenant = p_tenant LIMIT p_limit) AS r;
    IF v_in_flight >= p_limit THEN
        RAISE EXCEPTION 'too many runs in flight'
            USING ERRCODE = 'LFQ01',
                  DETAIL = json_build_object('tenant', p_tenant, 'limit', p_limit)::text;
    END IF;
END
$$;

-- Per-tenant quotas (migrations/0032_tenant_quotas.sql).

-- name: tenant_quotas
-- Every tenant's own quotas: the table is small (one row per tenant with a quota of its own) and read as a
-- whole every few seconds, never per request.
SELECT tenant, max_runs_in_flight, starts_per_second, appends_per_second FROM ledgerflow.tenant_quotas

-- name: admit_run
-- Exact across processes: see ledgerflow.wf_admit_run (a lock per tenant until this start commits). Fails
-- with LFQ01 when the tenant has `at_most` runs in flight already.
SELECT ledgerflow.wf_admit_run(%(tenant)s, %(at_most)s)

-- name: set_tenant_quota
INSERT INTO ledgerflow.tenant_quotas AS t (tenant, max_runs_in_flight, starts_per_second, appends_per_second)
VALUES (%(tenant)s, %(max_runs_in_flight)s, %(starts_per_second)s, %(appends_per_second)s)
ON CONFLICT (tenant) DO UPDATE
   SET max_runs_in_flight = excluded.max_runs_in_flight, starts_per_second = excluded.starts_per_second,
       appends_per_second = excluded.appends_per_second, updated_at = clock_timestamp()

-- name: clear_tenant_quota
DELETE FROM ledgerflow.tenant_quotas WHERE tenant = %(tenant)s

-- name: take_rate_tokens
-- Exact across processes: see ledgerflow.take_rate_tokens (the tenant's bucket row, locked while it is
-- taken from). `granted`: tokens taken (0: none, then `retry_after` seconds until one will be there).
SELECT granted, retry_after
  FROM ledgerflow.take_rate_tokens(
      p_tenant => %(tenant)s, p_quota => %(quota)s, p_rate => %(rate)s, p_capacity => %(capacity)s,
      p_at => %(at)s, p_want => %(want)s)

-- name: charge_rate_token
-- A token taken whatever the bucket holds, in the caller's transaction: see ledgerflow.charge_rate_token
-- (migration 0085). Returns the tokens left (below zero: the tenant's next takes wait for the debt).
SELECT ledgerflow.charge_rate_token(%(tenant)s, %(quota)s, %(rate)s, %(capacity)s, %(at)s)

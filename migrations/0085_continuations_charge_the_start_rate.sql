-- A continue_as_new successor counts against its tenant's starts per second without ever being refused
-- (workflows.quotas.TenantQuotas.charge_start): the continuation's transaction takes its token whatever the
-- bucket holds, so the bucket may go below zero, a debt the tenant's next starts pay back at the quota's
-- rate. Before, successors took nothing, so a tenant looping through continue_as_new started runs at any
-- rate its quota refused to its starts.

-- Take one token of `p_tenant`'s bucket for `p_quota` unconditionally, in the caller's transaction
-- (refilled first, as `take_rate_tokens` refills it); returns the tokens left, below zero when in debt.
-- Exact across processes as `take_rate_tokens` is: the bucket's row is read FOR UPDATE and written in the
-- same transaction, so a charge and concurrent takes apply one after the other; a charge whose
-- transaction rolls back (the continuation did not happen) took nothing.
CREATE FUNCTION ledgerflow.charge_rate_token(
    p_tenant text, p_quota text, p_rate double precision, p_capacity double precision, p_at timestamptz
) RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_at, clock_timestamp());
    v_tokens double precision;
BEGIN
    INSERT INTO ledgerflow.tenant_rate_buckets (tenant, quota, tokens, at)
    VALUES (p_tenant, p_quota, p_capacity, v_now)
    ON CONFLICT (tenant, quota) DO NOTHING;
    SELECT least(p_capacity, b.tokens + greatest(0, extract(epoch FROM v_now - b.at)) * p_rate)
      INTO v_tokens
      FROM ledgerflow.tenant_rate_buckets b
     WHERE b.tenant = p_tenant AND b.quota = p_quota
       FOR UPDATE;
    UPDATE ledgerflow.tenant_rate_buckets b
       SET tokens = v_tokens - 1, at = greatest(b.at, v_now)
     WHERE b.tenant = p_tenant AND b.quota = p_quota;
    RETURN v_tokens - 1;
END
$$;

-- `take_rate_tokens` as in migration 0075, but for a bucket in debt: it grants nothing (before, the floor of
-- a negative balance was "granted", adding tokens) and says how long until the debt is paid and a token is
-- there again.
CREATE OR REPLACE FUNCTION ledgerflow.take_rate_tokens(
    p_tenant text, p_quota text, p_rate double precision, p_capacity double precision, p_at timestamptz,
    p_want integer, OUT granted integer, OUT retry_after double precision
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_at, clock_timestamp());
    v_tokens double precision;
BEGIN
    INSERT INTO ledgerflow.tenant_rate_buckets (tenant, quota, tokens, at)
    VALUES (p_tenant, p_quota, p_capacity, v_now)
    ON CONFLICT (tenant, quota) DO NOTHING;
    SELECT least(p_capacity, b.tokens + greatest(0, extract(epoch FROM v_now - b.at)) * p_rate)
      INTO v_tokens
      FROM ledgerflow.tenant_rate_buckets b
     WHERE b.tenant = p_tenant AND b.quota = p_quota
       FOR UPDATE;
    granted := greatest(0, least(greatest(p_want, 1), floor(v_tokens)))::integer;
    retry_after := CASE WHEN granted >= 1 THEN 0 ELSE (1 - v_tokens) / p_rate END;
    UPDATE ledgerflow.tenant_rate_buckets b
       SET tokens = v_tokens - granted, at = greatest(b.at, v_now)
     WHERE b.tenant = p_tenant AND b.quota = p_quota;
END
$$;

-- Per-tenant rate quotas (starts and appends per second) shared by every process on the database: one token
-- bucket per tenant and quota, refilled from the database's clock and taken from in one statement
-- (ledgerflow.take_rate_token). Before, each process held its own buckets, so n API processes admitted up
-- to n times a tenant's rate. A row per tenant with a rate quota and per quota: the table stays small.
--
-- UNLOGGED: a take writes no WAL, so its commit waits for no WAL flush (the cost of a take is then about
-- one round trip). The buckets are no truth of anything: after a crash or on a promoted standby they
-- start empty, which admits each tenant one more burst, and nothing else changes.

CREATE UNLOGGED TABLE ledgerflow.tenant_rate_buckets (
    tenant  text             NOT NULL,
    quota   text             NOT NULL CHECK (quota IN ('starts_per_second', 'appends_per_second')),
    tokens  double precision NOT NULL,
    at      timestamptz      NOT NULL,
    PRIMARY KEY (tenant, quota)
);

-- Take up to `p_want` tokens (at least one, or none) of `p_tenant`'s bucket for `p_quota`, which refills
-- at `p_rate` tokens a second and holds at most `p_capacity`: `granted` is how many were taken (0: none,
-- and `retry_after` is the seconds until one will be there). `p_at`: the time to refill to (NULL: the
-- database's clock, the same for every process; tests pass their own). A process may take a few tokens at
-- once and spend them over the next moments (workflows.quotas): a tenant's requests then cost a round trip
-- only now and then, and no more tokens are ever spent, by all processes together, than the bucket gave.
--
-- Exact across processes: the bucket's row is read FOR UPDATE and written in the same transaction, so
-- concurrent takes of one tenant are applied one after the other, each to the tokens the previous one
-- left: no two takes spend the same token. The time never moves back (`greatest`): a take whose clock read
-- is older than the row's, having waited for that row's lock, refills nothing rather than a negative
-- amount. Other tenants' takes lock other rows and never wait here.
CREATE FUNCTION ledgerflow.take_rate_tokens(
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
    granted := least(greatest(p_want, 1), floor(v_tokens))::integer;
    retry_after := CASE WHEN granted >= 1 THEN 0 ELSE (1 - v_tokens) / p_rate END;
    UPDATE ledgerflow.tenant_rate_buckets b
       SET tokens = v_tokens - granted, at = greatest(b.at, v_now)
     WHERE b.tenant = p_tenant AND b.quota = p_quota;
END
$$;

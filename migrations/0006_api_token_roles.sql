-- API token roles and expiry.
-- A token is a tenant's (its scopes act on that tenant's data) or a server administrator's: besides
-- its own tenant's data it may rebuild, replay and verify the projections every tenant reads, sees every
-- tenant's failures and reads /metrics. A server administrator's token always holds `admin`.
ALTER TABLE ledgerflow.api_tokens
    ADD COLUMN role text NOT NULL DEFAULT 'tenant' CHECK (role IN ('tenant', 'server')),
    -- NULL: the token never expires. An expired token is refused like a revoked one.
    ADD COLUMN expires_at timestamptz,
    ADD CONSTRAINT api_tokens_server_role_is_admin CHECK (role = 'tenant' OR 'admin' = ANY (scopes)),
    ADD CONSTRAINT api_tokens_expiry_after_creation CHECK (expires_at IS NULL OR expires_at > created_at);

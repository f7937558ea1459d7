-- API tokens: bearer secrets for the HTTP API, each bound to one tenant and a set of scopes.
-- Only a SHA-256 of the secret is kept: a copy of the database does not let anyone call the API.

CREATE TABLE ledgerflow.api_tokens (
    -- The public part of the secret (`lf_<id>_<random>`), so a token is found without scanning hashes.
    id            text        PRIMARY KEY CHECK (id ~ '^[0-9a-f]{16}$'),
    name          text        NOT NULL CHECK (name <> '' AND length(name) <= 200),
    tenant        text        NOT NULL CHECK (tenant ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    -- admin implies every other scope.
    scopes        text[]      NOT NULL
                  CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['append', 'read', 'operate', 'admin']),
    -- Hex SHA-256 of the whole secret; never the secret itself.
    token_hash    text        NOT NULL CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    last_used_at  timestamptz,
    CONSTRAINT api_tokens_hash_unique UNIQUE (token_hash)
);
CREATE INDEX api_tokens_by_tenant ON ledgerflow.api_tokens (tenant, created_at);

-- API tokens (ops/auth.py runs these; the file sits here because ops/api/ is where the API's SQL lives).

-- name: insert_token
INSERT INTO ledgerflow.api_tokens (id, name, tenant, scopes, token_hash)
VALUES (%(id)s, %(name)s, %(tenant)s, %(scopes)s, %(token_hash)s)
RETURNING created_at

-- name: revoke_token
-- Revocation is effective for the very next request: `authenticate` reads the row every time, no cache.
UPDATE ledgerflow.api_tokens SET revoked_at = now()
 WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id

-- name: list_tokens
SELECT id, name, tenant, scopes, created_at, revoked_at, last_used_at
  FROM ledgerflow.api_tokens
 ORDER BY created_at, id

-- name: authenticate
-- One round trip: the token's row, and `last_used_at` touched at most once a minute (a write on every
-- request would turn each read into a write). The touch happens only when the secret's hash matches and
-- the token is live, so a guessed or revoked secret changes nothing.
WITH found AS (
    SELECT id, tenant, scopes, token_hash, revoked_at, last_used_at
      FROM ledgerflow.api_tokens
     WHERE id = %(id)s
), touched AS (
    UPDATE ledgerflow.api_tokens t SET last_used_at = now()
      FROM found f
     WHERE t.id = f.id AND f.token_hash = %(token_hash)s AND f.revoked_at IS NULL
       AND (f.last_used_at IS NULL OR f.last_used_at < now() - interval '60 seconds')
    RETURNING t.id
)
SELECT tenant, scopes, token_hash, revoked_at IS NOT NULL FROM found

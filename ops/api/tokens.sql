-- API tokens (ops/auth.py runs these; the file sits here because ops/api/ is where the API's SQL lives).

-- name: insert_token
-- The expiry is reckoned on the database's clock, the one `authenticate` compares it with.
INSERT INTO ledgerflow.api_tokens (id, name, tenant, scopes, role, expires_at, token_hash)
VALUES (%(id)s, %(name)s, %(tenant)s, %(scopes)s, %(role)s,
        now() + make_interval(secs => %(lifetime_seconds)s::double precision), %(token_hash)s)
RETURNING created_at

-- name: revoke_token
-- `authenticate` reads the row every time; the API keeps what it read for LEDGERFLOW_TOKEN_CACHE_SECONDS
-- (ops/api/token_lookups.py), so a revoked token stops working there within that time.
UPDATE ledgerflow.api_tokens SET revoked_at = now()
 WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id

-- name: list_tokens
SELECT id, name, tenant, scopes, role, created_at, expires_at, revoked_at, last_used_at
  FROM ledgerflow.api_tokens
 ORDER BY created_at, id

-- name: has_server_admin_token
SELECT 1 FROM ledgerflow.api_tokens WHERE role = 'server' LIMIT 1

-- name: authenticate
-- One round trip: the token's row, and `last_used_at` touched at most once a minute (a write on every
-- request would turn each read into a write). The touch happens only when the secret's hash matches and
-- the token is live, so a guessed, revoked or expired secret changes nothing. SKIP LOCKED: a request never
-- waits for another one's touch of the same token (that one records the use); the lock also re-checks
-- the minute on the row's latest version, so concurrent requests write it once.
WITH found AS (
    SELECT id, tenant, scopes, token_hash, revoked_at, role, expires_at
      FROM ledgerflow.api_tokens
     WHERE id = %(id)s
), touched AS (
    UPDATE ledgerflow.api_tokens t SET last_used_at = now()
     WHERE t.id = (
        SELECT id FROM ledgerflow.api_tokens
         WHERE id = %(id)s AND token_hash = %(token_hash)s AND revoked_at IS NULL
           AND (expires_at IS NULL OR expires_at > now())
           AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds')
           FOR UPDATE SKIP LOCKED
     )
    RETURNING t.id
)
SELECT tenant, scopes, token_hash, revoked_at IS NOT NULL AS revoked, role, expires_at,
       expires_at IS NOT NULL AND expires_at <= now() AS expired
  FROM found

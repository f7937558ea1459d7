-- The subjects' data keys (migration 0054), run by eventstore.keys only.

-- name: create_key
-- Two appends for a new subject at once create one key: the primary key lets one insert win, the other
-- does nothing and reads the winner's row on its next statement (a statement cannot see a row committed
-- after its snapshot, so the caller asks again when this answers no row). A forgotten subject's tombstone
-- is never replaced: the insert does nothing and the caller reads the tombstone.
WITH created AS (
    INSERT INTO ledgerflow.subject_keys (tenant, subject, key_id, wrapped_key, master_key_id)
    VALUES (%(tenant)s, %(subject)s, %(key_id)s, %(wrapped_key)s, %(master_key_id)s)
    ON CONFLICT (tenant, subject) DO NOTHING
    RETURNING key_id, wrapped_key, master_key_id
)
SELECT key_id, wrapped_key, master_key_id FROM created
UNION ALL
SELECT key_id, wrapped_key, master_key_id
  FROM ledgerflow.subject_keys
 WHERE tenant = %(tenant)s AND subject = %(subject)s
LIMIT 1

-- name: keys_for_read
-- The keys a page of events needs, by (tenant, subject); forgotten subjects have no row here.
SELECT k.tenant, k.subject, k.key_id, k.wrapped_key, k.master_key_id
  FROM unnest(%(tenants)b::text[], %(subjects)b::text[]) AS wanted (tenant, subject)
  JOIN ledgerflow.subject_keys k USING (tenant, subject)
 WHERE k.wrapped_key IS NOT NULL

-- name: forget_key
-- Deleting a live key. `forgotten_at IS NULL`: a second forgetting at once waits for the first, then finds
-- the row forgotten and changes nothing, so one forgetting is recorded.
UPDATE ledgerflow.subject_keys
   SET wrapped_key = NULL, master_key_id = NULL, forgotten_at = now(), forgotten_by = %(by)s
 WHERE tenant = %(tenant)s AND subject = %(subject)s AND forgotten_at IS NULL
RETURNING key_id, forgotten_at

-- name: forget_keyless
-- Forgetting a subject that has no key (yet): a tombstone, so that its later appends are sealed with a
-- key nobody keeps. Nothing when a row exists (a key created meanwhile: the caller forgets it again).
INSERT INTO ledgerflow.subject_keys AS k
       (tenant, subject, key_id, wrapped_key, master_key_id, forgotten_at, forgotten_by)
VALUES (%(tenant)s, %(subject)s, gen_random_uuid(), NULL, NULL, now(), %(by)s)
ON CONFLICT (tenant, subject) DO NOTHING
RETURNING key_id, forgotten_at

-- name: forgotten
SELECT key_id, forgotten_at FROM ledgerflow.subject_keys
 WHERE tenant = %(tenant)s AND subject = %(subject)s AND forgotten_at IS NOT NULL

-- name: keys_to_rotate
-- A batch of keys wrapped by another master key than the current one. SKIP LOCKED: two rotations at once
-- share the work instead of waiting on each other; a row forgotten meanwhile is left out.
SELECT tenant, subject, key_id, wrapped_key, master_key_id
  FROM ledgerflow.subject_keys
 WHERE wrapped_key IS NOT NULL AND master_key_id <> %(current)s
 ORDER BY tenant, subject
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED

-- name: rewrap
-- Only a key still wrapped as read (under the row lock taken by keys_to_rotate): a forget that won the
-- row first leaves nothing to re-wrap.
UPDATE ledgerflow.subject_keys
   SET wrapped_key = %(wrapped_key)s, master_key_id = %(master_key_id)s
 WHERE tenant = %(tenant)s AND subject = %(subject)s AND wrapped_key IS NOT NULL

-- name: key_counts
SELECT coalesce(master_key_id, '') AS master_key_id, count(*)::bigint AS keys
  FROM ledgerflow.subject_keys
 GROUP BY 1

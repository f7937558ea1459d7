-- Crypto-shredding: each subject's personal fields are encrypted with a data key of its own (see
-- eventstore.personal and eventstore.keys). The keys live here, never in the log, each wrapped (encrypted)
-- by the master key named in master_key_id. Forgetting a subject empties its row: wrapped_key goes, the
-- row stays as a tombstone, so no later append can give the subject a fresh key that would make its data
-- readable again, and the log's ciphertexts of it can never be decrypted.
--
-- Unlike the log, this table is updated: forgetting and master-key rotation rewrite rows in place.

CREATE TABLE ledgerflow.subject_keys (
    tenant         text        NOT NULL,
    subject        text        NOT NULL CHECK (length(subject) BETWEEN 1 AND 256),
    -- Written into each ciphertext's envelope: a reader decrypts only with the very key it was sealed
    -- with, and reads anything else as forgotten.
    key_id         uuid        NOT NULL,
    -- 12-byte nonce, then the AES-GCM ciphertext of the 32-byte data key under the master key; NULL once
    -- the subject is forgotten.
    wrapped_key    bytea,
    -- A fingerprint of the master key that wrapped the data key (rotation finds what it has left to do).
    master_key_id  text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    forgotten_at   timestamptz,
    forgotten_by   text,
    PRIMARY KEY (tenant, subject),
    CONSTRAINT subject_keys_forgotten_has_no_key
        CHECK ((wrapped_key IS NULL) = (forgotten_at IS NOT NULL)
               AND (wrapped_key IS NULL) = (master_key_id IS NULL))
);

-- Rotation walks the keys still wrapped by another master key than the current one.
CREATE INDEX subject_keys_by_master ON ledgerflow.subject_keys (master_key_id)
    WHERE wrapped_key IS NOT NULL;

"""The subjects' data keys: created once per (tenant, subject), wrapped by a master key, forgotten by
deleting them, re-wrapped when the master key changes. The only module that runs the key SQL (keys.sql).

A data key never reaches the log; the table (migration 0054) holds it only wrapped. Appends may keep a
subject's key in memory (`KeyCache`): were it forgotten meanwhile, what they seal with it can no longer be
read, since every read asks the table again (see `eventstore.personal`).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool
import structlog

from eventstore.arrays import TextArray
from eventstore.db import wrap_exceptions
from eventstore.errors import ConfigurationError, ConflictError, InvalidInputError
from eventstore.masterkeys import KEY_BYTES, MasterKeys, aes_gcm
from eventstore.rows import fetch_all, fetch_one
from eventstore.sqlfile import load_queries

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = structlog.get_logger(__name__)
Q = load_queries("eventstore", "keys.sql")

MAX_SUBJECT_LENGTH = 256
#: Data keys an append path keeps in memory (about 200 bytes each).
KEY_CACHE_SIZE = 10_000


class SubjectKey:
    """A subject's data key as an append or a read uses it; `cipher` None: the subject is forgotten."""

    __slots__ = ("cipher", "key_id", "key_text")

    def __init__(self, key_id: uuid.UUID, secret: bytes | None) -> None:
        self.key_id = key_id
        #: As written in the envelopes (compared for each field read).
        self.key_text = str(key_id)
        self.cipher: AESGCM | None = None if secret is None else aes_gcm(secret)


def check_subject(subject: object) -> str:
    """A subject id from an event's field: a non-empty string (or integer) of at most 256 characters."""
    if isinstance(subject, int) and not isinstance(subject, bool):
        subject = str(subject)
    if not isinstance(subject, str) or not subject or len(subject) > MAX_SUBJECT_LENGTH:
        raise InvalidInputError(
            f"subject {subject!r} is invalid: personal fields need a subject field holding a string of "
            f"1-{MAX_SUBJECT_LENGTH} characters (or an integer)"
        )
    if not subject.isprintable():
        raise InvalidInputError(f"subject {subject!r} contains control characters")
    return subject


class KeyCache:
    """Data keys appends have used, least recently used first out; bounded by `KEY_CACHE_SIZE`."""

    def __init__(self, size: int = KEY_CACHE_SIZE) -> None:
        self._size = size
        self._keys: OrderedDict[tuple[str, str], SubjectKey] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, subject: str) -> SubjectKey | None:
        with self._lock:
            key = self._keys.get((tenant, subject))
            if key is not None:
                self._keys.move_to_end((tenant, subject))
            return key

    def put(self, tenant: str, subject: str, key: SubjectKey) -> None:
        with self._lock:
            self._keys[(tenant, subject)] = key
            self._keys.move_to_end((tenant, subject))
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)

    def drop(self, tenant: str, subject: str) -> None:
        with self._lock:
            self._keys.pop((tenant, subject), None)


class UnwrappedKeys:
    """Data keys reads have unwrapped, by (tenant, subject, key id), least recently used first out; bounded
    by `KEY_CACHE_SIZE`. Used only for keys a read has just found live in the table (see `keys_for_read`)."""

    def __init__(self, size: int = KEY_CACHE_SIZE) -> None:
        self._size = size
        self._keys: OrderedDict[tuple[str, str, uuid.UUID], SubjectKey] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, subject: str, key_id: uuid.UUID) -> SubjectKey | None:
        with self._lock:
            key = self._keys.get((tenant, subject, key_id))
            if key is not None:
                self._keys.move_to_end((tenant, subject, key_id))
            return key

    def get_many(self, wanted: list[tuple[str, str, uuid.UUID]]) -> list[SubjectKey | None]:
        """`get` for each of `wanted` (tenant, subject, key id), under one taking of the lock."""
        found: list[SubjectKey | None] = []
        with self._lock:
            keys = self._keys
            for place in wanted:
                key = keys.get(place)
                if key is not None:
                    keys.move_to_end(place)
                found.append(key)
        return found

    def put(self, tenant: str, subject: str, key: SubjectKey) -> None:
        with self._lock:
            self._keys[(tenant, subject, key.key_id)] = key
            self._keys.move_to_end((tenant, subject, key.key_id))
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)

    def drop(self, tenant: str, subject: str) -> None:
        with self._lock:
            for found in [k for k in self._keys if k[0] == tenant and k[1] == subject]:
                del self._keys[found]


@dataclass(frozen=True, slots=True)
class Forgotten:
    """The answer to `forget`: the forgotten key's id, when, and whether it had been forgotten before."""

    tenant: str
    subject: str
    key_id: uuid.UUID
    forgotten_at: Any
    already: bool


@dataclass(frozen=True, slots=True)
class _StoredKey:
    """A row of create_key (keys.sql): the subject's key, the one just created or the one already kept;
    a forgotten subject's has neither wrapped key nor master key."""

    key_id: uuid.UUID
    wrapped_key: bytes | None
    master_key_id: str | None


def _master_keys(*, master_key_id: str, keys: int) -> tuple[str, int]:
    """A row of key_counts: a master key id ('' for forgotten subjects) and how many data keys it wraps."""
    return master_key_id, keys


@dataclass(frozen=True, slots=True)
class _LiveKey:
    """A row of keys_for_read (keys.sql): a subject's live key, its secret wrapped by a master key."""

    tenant: str
    subject: str
    key_id: uuid.UUID
    wrapped_key: bytes
    master_key_id: str


@dataclass(frozen=True, slots=True)
class _ForgottenKey:
    """A row of forget_key, forget_keyless and forgotten (keys.sql)."""

    key_id: uuid.UUID
    forgotten_at: Any


@dataclass(frozen=True, slots=True)
class RotationProgress:
    rewrapped: int
    remaining: int


class SubjectKeys:
    """The data key table, through one pool."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool,
        masters: MasterKeys,
        statement_connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]] | None = None,
    ) -> None:
        self.pool = pool
        self.masters = masters
        self.cache = KeyCache()
        #: Data keys reads have unwrapped, by (tenant, subject, key id): a read still asks the table which
        #: keys live at that moment (a forgotten key is not in its answer, so nothing cached here decrypts
        #: after its forgetting, in this process or any other); it only skips unwrapping them again.
        self.unwrapped = UnwrappedKeys()
        #: Where a key is created: the appending thread's own connection (`EventStore.statement_connection`),
        #: so an append that creates a key neither holds two connections nor gives its pinned one back.
        self._statement_connection = statement_connection or pool.connection

    def key_for_append(self, tenant: str, subject: str) -> SubjectKey:
        """The subject's key, created at its first personal field. A forgotten subject answers a key that
        no one keeps (`secret` None), so what is sealed for it is forgotten at once."""
        cached = self.cache.get(tenant, subject)
        if cached is not None:
            return cached
        key_id = uuid.uuid4()
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # loaded at the first personal field

        secret = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
        wrapped, master_id = self.masters.wrap(tenant, subject, key_id, secret)
        params = {
            "tenant": tenant,
            "subject": subject,
            "key_id": key_id,
            "wrapped_key": wrapped,
            "master_key_id": master_id,
        }
        row = None
        with wrap_exceptions(), self._statement_connection() as conn:
            # Autocommit, committed before the append that uses it: a key is never lost with a rolled-back
            # caller's transaction while an append path still holds it. Twice at most: the second
            # statement sees the row of an insert that won while the first waited.
            for _ in range(2):
                row = fetch_one(conn, _StoredKey, Q["create_key"], params)
                if row is not None:
                    break
        if row is None:
            raise ConfigurationError(f"the data key of subject {subject!r} could not be read back")
        found_id, found_wrapped, found_master = row.key_id, row.wrapped_key, row.master_key_id
        # The table's check holds both None together: a forgotten subject's row keeps neither.
        if found_wrapped is None or found_master is None:
            key = SubjectKey(found_id, None)
        elif found_id == key_id:
            key = SubjectKey(key_id, secret)
            log.info("subject_key_created", tenant=tenant, key_id=str(key_id))
        else:
            key = SubjectKey(
                found_id, self.masters.unwrap(tenant, subject, found_id, bytes(found_wrapped), found_master)
            )
        self.cache.put(tenant, subject, key)
        return key

    def keys_for_read(
        self, conn: psycopg.Connection[Any], wanted: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], SubjectKey]:
        """The live keys of `wanted` (tenant, subject) pairs, read now on `conn`; forgotten ones are
        absent. Which keys live is never taken from memory: a forgotten key must not decrypt anything
        after its forgetting, whichever process forgot it."""
        pairs = sorted(set(wanted))
        rows = fetch_all(
            conn,
            _LiveKey,
            Q["keys_for_read"],
            {"tenants": TextArray(t for t, _ in pairs), "subjects": TextArray(s for _, s in pairs)},
        )
        found: dict[tuple[str, str], SubjectKey] = {}
        # Live now (the rows above): a key's secret, the same for ever under one key id (a key is never
        # changed, only re-wrapped or forgotten), may come from an earlier unwrapping.
        unwrapped = self.unwrapped.get_many([(r.tenant, r.subject, r.key_id) for r in rows])
        for row, known in zip(rows, unwrapped, strict=True):
            if known is None:
                secret = self.masters.unwrap(
                    row.tenant, row.subject, row.key_id, bytes(row.wrapped_key), row.master_key_id
                )
                known = SubjectKey(row.key_id, secret)
                self.unwrapped.put(row.tenant, row.subject, known)
            found[(row.tenant, row.subject)] = known
        return found

    def forget_txn(self, conn: psycopg.Connection[Any], tenant: str, subject: str, by: str) -> Forgotten:
        """Delete the subject's key, leaving a tombstone, in the caller's transaction (READ COMMITTED: each
        statement sees what committed before it, so a key created between two of them is found)."""
        subject = check_subject(subject)
        # This process keeps no copy of the key from here on (were the forgetting rolled back, the key
        # would only be read again). Reads never needed this: each asks the table (see `keys_for_read`).
        self.unwrapped.drop(tenant, subject)
        self.cache.drop(tenant, subject)
        params = {"tenant": tenant, "subject": subject, "by": by}
        for _ in range(3):
            for name in ("forget_key", "forget_keyless"):
                key = fetch_one(conn, _ForgottenKey, Q[name], params)
                if key is not None:
                    return Forgotten(tenant, subject, key.key_id, key.forgotten_at, already=False)
            key = fetch_one(conn, _ForgottenKey, Q["forgotten"], params)
            if key is not None:
                return Forgotten(tenant, subject, key.key_id, key.forgotten_at, already=True)
        raise ConflictError(
            f"subject {subject!r} (tenant {tenant!r}) had its key created and changed while being "
            "forgotten; nothing was forgotten. Run the forgetting again."
        )

    def rotate_batch(self, limit: int = 500) -> RotationProgress:
        """Re-wrap up to `limit` data keys under the current master key, in one transaction: a crash
        loses at most this batch's work, and running again goes on from what is left."""
        master = self.masters.require("rotating the master key needs the new one")
        with wrap_exceptions(), self.pool.connection() as conn:
            with conn.transaction():
                wanted = {"current": master.key_id, "limit": limit}
                rows = conn.execute(Q["keys_to_rotate"], wanted).fetchall()
                for tenant, subject, key_id, wrapped, master_id in rows:
                    secret = self.masters.unwrap(tenant, subject, key_id, bytes(wrapped), master_id)
                    rewrapped, _ = self.masters.wrap(tenant, subject, key_id, secret)
                    conn.execute(
                        Q["rewrap"],
                        {
                            "tenant": tenant,
                            "subject": subject,
                            "wrapped_key": rewrapped,
                            "master_key_id": master.key_id,
                        },
                    )
            counts = dict(fetch_all(conn, _master_keys, Q["key_counts"]))
        remaining = sum(n for m, n in counts.items() if m not in ("", master.key_id))
        return RotationProgress(len(rows), remaining)

    def key_counts(self) -> dict[str, int]:
        """Data keys per master key id ('' for forgotten subjects)."""
        with wrap_exceptions(), self.pool.connection() as conn:
            return dict(fetch_all(conn, _master_keys, Q["key_counts"]))

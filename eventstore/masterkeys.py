"""Master keys: the keys that wrap (encrypt) the subjects' data keys, from LEDGERFLOW_MASTER_KEY or
LEDGERFLOW_MASTER_KEY_FILE, and the previous ones that still unwrap until a rotation is done."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eventstore.errors import ConfigurationError, MasterKeyMissingError, MasterKeyUnknownError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12


def aes_gcm(secret: bytes) -> AESGCM:
    """AES-GCM under `secret`. cryptography (OpenSSL underneath) is imported at its first use, so that
    a process that never meets a personal field (most CLI calls) does not load it."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(secret)


def generate_master_key() -> str:
    """A new master key, as LEDGERFLOW_MASTER_KEY takes it: the base64 of 32 random bytes."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


@dataclass(frozen=True, slots=True, repr=False)
class MasterKey:
    """A master key and its fingerprint (stored beside each data key it wraps; never the key itself)."""

    key_id: str
    secret: bytes

    @classmethod
    def parse(cls, text: str, source: str) -> MasterKey:
        try:
            # Either alphabet: the standard one, or the URL-safe one of `secrets.token_urlsafe`-like tools.
            secret = base64.b64decode(text.strip().replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            secret = b""
        if len(secret) != KEY_BYTES:
            raise ConfigurationError(
                f"{source} is not a master key: give the base64 of exactly {KEY_BYTES} random bytes "
                "(`ledgerflow keys generate` prints one)"
            )
        fingerprint = hashlib.sha256(b"ledgerflow master key\x00" + secret).hexdigest()[:16]
        return cls(fingerprint, secret)

    def __repr__(self) -> str:
        return f"MasterKey({self.key_id})"


def _aad(tenant: str, subject: str, key_id: uuid.UUID) -> bytes:
    """A wrapped key is bound to its row: moved to another subject or tenant, it does not unwrap."""
    return f"{tenant}\x00{subject}\x00{key_id}".encode()


class MasterKeys:
    """The current master key (wraps new data keys) and previous ones (still unwrap, until rotation)."""

    def __init__(self, current: MasterKey | None, previous: Sequence[MasterKey] = ()) -> None:
        self.current = current
        self._by_id = {k.key_id: k for k in previous}
        if current is not None:
            self._by_id[current.key_id] = current

    @classmethod
    def from_settings(
        cls, master_key: str | None, master_key_file: Path | None, previous_master_keys: str | None
    ) -> MasterKeys:
        if master_key and master_key_file:
            raise ConfigurationError(
                "both LEDGERFLOW_MASTER_KEY and LEDGERFLOW_MASTER_KEY_FILE are set: keep one of them"
            )
        current = None
        if master_key:
            current = MasterKey.parse(master_key, "LEDGERFLOW_MASTER_KEY")
        elif master_key_file is not None:
            try:
                text = master_key_file.read_text(encoding="ascii")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(
                    f"LEDGERFLOW_MASTER_KEY_FILE {str(master_key_file)!r} cannot be read ({exc}); "
                    "point it at a file that holds the base64 of 32 random bytes"
                ) from exc
            current = MasterKey.parse(text, f"the file {str(master_key_file)!r}")
        previous = [
            MasterKey.parse(part, "an entry of LEDGERFLOW_PREVIOUS_MASTER_KEYS")
            for part in (previous_master_keys or "").split(",")
            if part.strip()
        ]
        return cls(current, previous)

    def require(self, what: str) -> MasterKey:
        if self.current is None:
            raise MasterKeyMissingError(what)
        return self.current

    def wrap(self, tenant: str, subject: str, key_id: uuid.UUID, data_key: bytes) -> tuple[bytes, str]:
        master = self.require(f"subject {subject!r} needs a data key")
        nonce = os.urandom(NONCE_BYTES)
        sealed = aes_gcm(master.secret).encrypt(nonce, data_key, _aad(tenant, subject, key_id))
        return nonce + sealed, master.key_id

    def unwrap(self, tenant: str, subject: str, key_id: uuid.UUID, wrapped: bytes, master_id: str) -> bytes:
        if not self._by_id:
            raise MasterKeyMissingError(f"subject {subject!r} has personal data to decrypt")
        master = self._by_id.get(master_id)
        if master is None:
            raise MasterKeyUnknownError(master_id)
        from cryptography.exceptions import InvalidTag

        try:
            return aes_gcm(master.secret).decrypt(
                wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _aad(tenant, subject, key_id)
            )
        except InvalidTag:
            raise ConfigurationError(
                f"the data key of subject {subject!r} (tenant {tenant!r}) does not unwrap with master key "
                f"{master_id}: its row was altered, or another key was configured under that fingerprint"
            ) from None
